#include "sampler/row_processor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "sampler/dtype.h"
#include "sampler/spec_rules.h"
#include "sampler/row_kernels.h"

namespace samplerd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A bucket of the score order: the top 12 bits of the float's order-preserving key.
constexpr int kBucketBits = 12;
constexpr int kNumBuckets = 1 << kBucketBits;
inline uint32_t ScoreBucket(float score) { return OrderKey(score) >> (32 - kBucketBits); }

// SPEC 5's inverse-CDF draw over weights w(t), t in [0, vocab), in the order `before(a, b)`
// (a before b), without sorting the vocabulary: the mass per bucket of the weight's float image
// locates the bucket holding u's interval, and only that bucket is sorted. `before` must agree
// with the weights' order where they differ (a bucket is a range of weights); where two weights
// are equal it decides, so a draw from p passes the scores' order (two tokens of different
// scores can share a float weight: ordering them by id would put the lower-scored first, and
// move their intervals by a whole token's probability against the exact ones).
// Returns -1 when every weight is 0.
template <typename WeightFn, typename Before>
int32_t DrawByWeight(int32_t vocab, WeightFn weight, double u, Before before) {
  std::array<double, kNumBuckets> hist{};
  for (int32_t t = 0; t < vocab; ++t) {
    const double w = weight(t);
    if (w > 0.0) hist[ScoreBucket(static_cast<float>(w))] += w;
  }
  double total = 0.0;
  for (int b = kNumBuckets - 1; b >= 0; --b) total += hist[b];
  if (!(total > 0.0)) return -1;
  const double target = u * total;
  double mass_before = 0.0;
  int crossing = -1;
  for (int b = kNumBuckets - 1; b >= 0; --b) {
    if (hist[b] == 0.0) continue;
    crossing = b;  // ends on the last non-empty bucket should rounding leave none
    if (mass_before + hist[b] > target) break;
    mass_before += hist[b];
  }
  std::vector<std::pair<double, int32_t>> members;
  for (int32_t t = 0; t < vocab; ++t) {
    const double w = weight(t);
    if (w > 0.0 && static_cast<int>(ScoreBucket(static_cast<float>(w))) == crossing) {
      members.emplace_back(w, t);
    }
  }
  std::sort(members.begin(), members.end(),
            [&before](const auto& a, const auto& b) { return before(a.second, b.second); });
  double cumulative = mass_before;
  for (const auto& [w, t] : members) {
    cumulative += w;
    if (cumulative > target) return t;
  }
  return members.back().second;
}

}  // namespace

absl::Status NonFiniteLogitsError(const std::string& field, int32_t row, int32_t vocab_size) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": logits row ", row,
                                                 " has a NaN or +inf among its first vocab_size = ",
                                                 vocab_size, " columns"));
}

absl::Status ValueOverflowError(const std::string& field, int32_t row) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": logits row ", row,
                   ": a logit bias, a penalty or the temperature pushed a finite value out of "
                   "the float32 range"));
}

absl::Status NoTokenLeftError(const std::string& field, int32_t row) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": logits row ", row, " has no token left (every token is masked or -inf)"));
}

absl::Status RowProcessor::Process(const LogitsView& logits, int32_t row,
                                   const RowOptions& options) {
  const NormalizedParams& params = *options.params;
  const int32_t vocab = options.vocab_size;
  vocab_size_ = vocab;
  scores_.resize(vocab);
  weights_.resize(vocab);
  kept_sorted_ = false;
  kept_.clear();
  top_n_ids_.clear();
  head_count_ = 0;

  // Step 1: padding columns (>= V) are never read, so never sampled.
  LoadRowAsFloat(logits, row, vocab, scores_.data());
  if (HasNanOrPosInf(scores_.data(), vocab)) {
    return NonFiniteLogitsError(options.field, row, vocab);
  }
  if (options.keep_raw) {
    raw_.assign(scores_.begin(), scores_.end());
    raw_max_ = RowMax(raw_.data(), vocab);
    // weights_ is scratch until ExpShiftAndSum below.
    raw_log_sum_ = std::log(ExpShiftAndSum(raw_.data(), vocab, static_cast<float>(raw_max_),
                                           weights_.data()));
  }
  if (!options.prompt_mode) {
    if (options.mask != nullptr) ApplyMask(options.mask);                    // step 2
    if (!options.updates.empty() &&                                          // steps 2b-d, 3
        !ApplyTokenUpdates(options)) {
      return ValueOverflowError(options.field, row);
    }
    if (options.force_top_n > 0 && options.force_top_n < vocab) {
      ApplyForceTopN(options.force_top_n);                                   // step 4
    }
    if (params.top_n_sigma > 0.0f) ApplyTopNSigma(params.top_n_sigma);      // step 4
  }
  if (params.temperature != 1.0f &&                                          // step 5
      DivideInPlace(scores_.data(), vocab, params.temperature)) {
    return ValueOverflowError(options.field, row);
  }

  max_score_ = RowMax(scores_.data(), vocab);
  if (max_score_ == kNegInf) {
    return NoTokenLeftError(options.field, row);
  }
  total_sum_ = ExpShiftAndSum(scores_.data(), vocab, max_score_, weights_.data());
  // Until a filter cuts it, the kept set is every finite token: the cut (-inf, -1) admits
  // exactly the finite scores.
  cut_score_ = kNegInf;
  cut_token_ = -1;
  kept_sum_ = total_sum_;

  if (params.top_p < 1.0f || (params.top_k > 0 && params.top_k < vocab)) {
    ApplyTopPTopK(params.top_p, params.top_k);                               // steps 6, 7
  }
  if (!options.prompt_mode && params.min_p > 0.0f) ApplyMinP(params.min_p);  // step 8
  SumKept();
  if (!options.prompt_mode && options.xtc_u < params.xtc_probability) {     // step 8: XTC
    if (ApplyXtc(params.xtc_threshold)) RebaseKept();
  }
  log_kept_sum_ = std::log(kept_sum_);                                      // step 9
  return absl::OkStatus();
}

void RowProcessor::SumKept() {
  if (!kept_sorted_ && cut_token_ < 0 && head_count_ == 0) return;  // all finite: total_sum_
  kept_sum_ = 0.0;
  ForEachKept([this](int32_t t) { kept_sum_ += weights_[t]; });
}

void RowProcessor::RebaseKept() {
  // The survivors are finite (kept), so their weights relative to their own max are >= 1.
  std::vector<int32_t>& kept = rebase_ids_;
  kept.clear();
  ForEachKept([&kept](int32_t t) { kept.push_back(t); });
  if (kept.empty()) return;
  rebase_scores_.resize(kept.size());
  rebase_weights_.resize(kept.size());
  float top = kNegInf;
  for (size_t i = 0; i < kept.size(); ++i) {
    rebase_scores_[i] = scores_[kept[i]];
    top = std::max(top, rebase_scores_[i]);
  }
  kept_sum_ = ExpShiftAndSum(rebase_scores_.data(), static_cast<int32_t>(kept.size()), top,
                             rebase_weights_.data());
  for (size_t i = 0; i < kept.size(); ++i) weights_[kept[i]] = rebase_weights_[i];
  max_score_ = top;
}

void RowProcessor::ApplyTopNSigma(float n) {
  // M, mu and sigma (population) of the finite values, in float64, two passes; NaN and +inf
  // were refused and -inf are the removed tokens.
  const int32_t vocab = vocab_size_;
  double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
  int64_t count = 0;
  for (int32_t t = 0; t < vocab; ++t) {
    const float x = scores_[t];
    if (x == kNegInf) continue;
    max = std::max(max, static_cast<double>(x));
    sum += x;
    ++count;
  }
  if (count == 0) return;
  const double mean = sum / static_cast<double>(count);
  double squares = 0.0;
  for (int32_t t = 0; t < vocab; ++t) {
    if (scores_[t] == kNegInf) continue;
    const double d = scores_[t] - mean;
    squares += d * d;
  }
  const double bound = max - static_cast<double>(n) * std::sqrt(squares / static_cast<double>(count));
  for (int32_t t = 0; t < vocab; ++t) {
    if (static_cast<double>(scores_[t]) < bound) scores_[t] = kNegInf;  // never the max
  }
}

bool RowProcessor::ApplyXtc(float threshold) {
  // The kept tokens with p >= threshold, best first: a prefix of the kept order (p grows with
  // the score), so the sorted kept set's front, or found by a pass and sorted.
  const double limit = static_cast<double>(threshold);
  std::vector<int32_t>& top = ids_;
  top.clear();
  if (kept_sorted_) {
    for (int32_t t : kept_) {
      if (static_cast<double>(weights_[t]) / kept_sum_ < limit) break;
      top.push_back(t);
    }
  } else {
    for (int32_t t = 0; t < vocab_size_; ++t) {
      if (Kept(t) && static_cast<double>(weights_[t]) / kept_sum_ >= limit) top.push_back(t);
    }
    SortByScore(scores_.data(), &top);
  }
  if (top.size() < 2) return false;
  // Every one of them but the last (the least likely; among equals the highest id) goes.
  const size_t removed = top.size() - 1;
  head_count_ = static_cast<int64_t>(removed);
  head_score_ = scores_[top[removed - 1]];
  head_token_ = top[removed - 1];
  if (kept_sorted_) kept_.erase(kept_.begin(), kept_.begin() + static_cast<ptrdiff_t>(removed));
  return true;
}

void RowProcessor::RawTop(int32_t n, TopLogprobs* out) const {
  out->token_ids.assign(n, -1);
  out->logprobs.assign(n, kNegInf);
  if (n <= 0) return;
  SelectTopK(raw_.data(), vocab_size_, n, &ids_);
  for (size_t i = 0; i < ids_.size() && static_cast<int32_t>(i) < n; ++i) {
    const int32_t t = ids_[i];
    if (raw_[t] == kNegInf) break;
    out->token_ids[i] = t;
    out->logprobs[i] = RawLogprob(t);
  }
}

void RowProcessor::ApplyMask(const unsigned char* mask) {
  // Bit t % 32 of little-endian word t / 32 is bit t % 8 of byte t / 8.
  const int32_t vocab = vocab_size_;
  for (int32_t byte = 0; byte * 8 < vocab; ++byte) {
    const unsigned bits = mask[byte];
    if (bits == 0xFFu) continue;
    const int32_t end = std::min(vocab, byte * 8 + 8);
    for (int32_t t = byte * 8; t < end; ++t) {
      if (!MaskAllows(mask, t)) scores_[t] = kNegInf;
    }
  }
}

bool RowProcessor::ApplyTokenUpdates(const RowOptions& options) {
  const PenaltySettings penalties = options.params->Penalties();
  bool left_range = false;
  for (const TokenUpdate& u : options.updates) {
    scores_[u.token] = UpdateToken(scores_[u.token], u, penalties, &left_range);
  }
  return !left_range;
}

void RowProcessor::ApplyForceTopN(int32_t n) {
  SelectTopK(scores_.data(), vocab_size_, n, &top_n_ids_);
  // weights_ is free until ExpShiftAndSum: use it to hold the survivors' scores.
  for (size_t i = 0; i < top_n_ids_.size(); ++i) weights_[i] = scores_[top_n_ids_[i]];
  std::fill(scores_.begin(), scores_.end(), kNegInf);
  for (size_t i = 0; i < top_n_ids_.size(); ++i) scores_[top_n_ids_[i]] = weights_[i];
}

void RowProcessor::PrefixByMass(double mass, std::vector<int32_t>* out) const {
  const int32_t vocab = vocab_size_;
  std::array<double, kNumBuckets> hist{};
  for (int32_t t = 0; t < vocab; ++t) {
    if (weights_[t] > 0.0f) hist[ScoreBucket(scores_[t])] += weights_[t];
  }
  int crossing = -1;
  double cumulative = 0.0;
  for (int b = kNumBuckets - 1; b >= 0; --b) {
    cumulative += hist[b];
    if (cumulative > mass) {
      crossing = b;
      break;
    }
  }
  out->clear();
  for (int32_t t = 0; t < vocab; ++t) {
    if (scores_[t] == kNegInf) continue;
    if (crossing < 0 || static_cast<int>(ScoreBucket(scores_[t])) >= crossing) out->push_back(t);
  }
  SortByScore(scores_.data(), out);
}

void RowProcessor::ApplyTopPTopK(float top_p, int32_t top_k) {
  std::vector<int32_t>& candidates = kept_;
  const bool by_rank = top_k > 0 && top_k < vocab_size_;
  if (by_rank) {
    SelectTopK(scores_.data(), vocab_size_, top_k, &candidates);
  } else {
    PrefixByMass(static_cast<double>(top_p) * total_sum_, &candidates);
  }
  if (top_p < 1.0f) {
    // SPEC 3.6 (TopPRemoves): the first candidate whose mass before it exceeds top_p, and
    // that mass.
    double before = 0.0;
    auto first_removed = [&]() -> size_t {
      before = 0.0;
      for (size_t r = 0; r < candidates.size(); ++r) {
        if (TopPRemoves(before, total_sum_, top_p)) return r;
        before += weights_[candidates[r]];
      }
      return candidates.size();
    };
    size_t keep = first_removed();
    if (keep == candidates.size() && !by_rank && !TopPRemoves(before, total_sum_, top_p)) {
      // The histogram's rounding stopped short of the nucleus' end: take every finite token.
      candidates.clear();
      for (int32_t t = 0; t < vocab_size_; ++t) {
        if (scores_[t] != kNegInf) candidates.push_back(t);
      }
      SortByScore(scores_.data(), &candidates);
      keep = first_removed();
    }
    candidates.resize(keep);
  }
  kept_sorted_ = true;
  cut_score_ = scores_[candidates.back()];
  cut_token_ = candidates.back();
}

void RowProcessor::ApplyMinP(float min_p) {
  // MinPRemoves: p_x < min_p * p_max  <=>  exp(s_x - max) < min_p (the largest kept weight is 1).
  if (kept_sorted_) {
    while (kept_.size() > 1 && MinPRemoves(weights_[kept_.back()], min_p)) kept_.pop_back();
    cut_score_ = scores_[kept_.back()];
    cut_token_ = kept_.back();
    return;
  }
  float cut = std::numeric_limits<float>::infinity();
  int32_t cut_token = -1;
  for (int32_t t = 0; t < vocab_size_; ++t) {
    if (!MinPRemoves(weights_[t], min_p) && scores_[t] <= cut) {
      cut = scores_[t];
      cut_token = t;  // for equal scores the last (highest) id is the lowest ranked
    }
  }
  cut_score_ = cut;
  cut_token_ = cut_token;
}

int64_t RowProcessor::NumKept() const {
  if (kept_sorted_) return static_cast<int64_t>(kept_.size());
  int64_t n = 0;
  for (int32_t t = 0; t < vocab_size_; ++t) n += Kept(t) ? 1 : 0;
  return n;
}

int32_t RowProcessor::Draw(double u) const {
  if (kept_sorted_) {
    const double target = u * kept_sum_;
    double cumulative = 0.0;
    for (int32_t t : kept_) {
      cumulative += weights_[t];
      if (cumulative > target) return t;
    }
    return kept_.back();
  }
  // Full-vocabulary draw without a full sort.
  return DrawByWeight(
      vocab_size_,
      [this](int32_t t) -> double { return Kept(t) ? static_cast<double>(weights_[t]) : 0.0; }, u,
      ScoreOrder{scores_.data()});
}

int32_t RowProcessor::DrawFromKeptWeights(const std::function<double(int32_t, double)>& weight,
                                          double u) const {
  entries_.clear();
  ForEachKept([&](int32_t t) {
    const double w = weight(t, Probability(t));
    if (w > 0.0) entries_.emplace_back(w, t);
  });
  if (entries_.empty()) return -1;
  constexpr size_t kSortLimit = 4096;
  if (entries_.size() > kSortLimit) {
    // Many candidates: the bucketed draw over a dense copy (in id order) avoids a full sort.
    dense_.assign(vocab_size_, 0.0);
    for (const auto& [w, t] : entries_) dense_[t] = w;
    // The residual's order is its own value's (SPEC 6; the CUDA kernels order it by the
    // float64 value too), ties by id.
    return DrawByWeight(vocab_size_, [this](int32_t t) { return dense_[t]; }, u,
                        [this](int32_t a, int32_t b) {
                          return dense_[a] > dense_[b] || (dense_[a] == dense_[b] && a < b);
                        });
  }
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  double total = 0.0;
  for (const auto& entry : entries_) total += entry.first;
  const double target = u * total;
  double cumulative = 0.0;
  for (const auto& [w, t] : entries_) {
    cumulative += w;
    if (cumulative > target) return t;
  }
  return entries_.back().second;
}

void RowProcessor::Top(int32_t n, TopLogprobs* out) const {
  out->token_ids.assign(n, -1);
  out->logprobs.assign(n, kNegInf);
  if (n <= 0) return;
  const std::vector<int32_t>* best = &kept_;
  size_t skip = 0;  // XTC's removed head, ahead of the kept tokens in the score order
  if (!kept_sorted_) {
    skip = static_cast<size_t>(head_count_);
    SelectTopK(scores_.data(), vocab_size_, n + static_cast<int32_t>(skip), &ids_);
    best = &ids_;
  }
  const int32_t count =
      std::min<int32_t>(n, static_cast<int32_t>(best->size()) - static_cast<int32_t>(skip));
  for (int32_t i = 0; i < count; ++i) {
    const int32_t t = (*best)[skip + i];
    if (!Kept(t)) break;  // the kept set is a prefix of this order
    out->token_ids[i] = t;
    out->logprobs[i] = Logprob(t);
  }
}

float RowProcessor::SumSmallerProbs(int32_t token) const {
  if (!Kept(token)) return 0.0f;
  const float pivot = scores_[token];
  double sum = 0.0;
  auto add = [&](int32_t x) {
    const float s = scores_[x];
    if (s < pivot || (s == pivot && x <= token)) sum += weights_[x];
  };
  if (kept_sorted_) {
    for (int32_t x : kept_) add(x);
  } else {
    for (int32_t x = 0; x < vocab_size_; ++x) {
      if (Kept(x)) add(x);
    }
  }
  return static_cast<float>(sum / kept_sum_);
}

}  // namespace samplerd
