#include "sampler/token_updates.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace samplerd {
namespace {

// Whether the history (output then drafts) ends with `prefix`.
bool HistoryEndsWith(absl::Span<const int32_t> output, absl::Span<const int32_t> drafts,
                     absl::Span<const int32_t> prefix) {
  const size_t n = prefix.size();
  if (n > output.size() + drafts.size()) return false;
  for (size_t i = 0; i < n; ++i) {
    // Element i of prefix against element (len - n + i) of the concatenated history.
    const size_t at = output.size() + drafts.size() - n + i;
    const int32_t h = at < output.size() ? output[at] : drafts[at - output.size()];
    if (h != prefix[i]) return false;
  }
  return true;
}

TokenUpdate Entry(int32_t token, int32_t flags) {
  TokenUpdate u;
  u.token = token;
  u.flags = flags;
  return u;
}

// Entries of one token merged into one: bans win (a banned token is -inf whatever else applies),
// biases add, history counts add. Entries of the same token keep their order of appending
// (stable sort), so the float sums are the same on every call.
// The first bias of a kind is taken as sent (a -0.0 bias stays -0.0), later ones add.
void Merge(TokenUpdate& into, const TokenUpdate& u) {
  if (u.flags & kUpdateBias) into.bias = (into.flags & kUpdateBias) ? into.bias + u.bias : u.bias;
  if (u.flags & kUpdateLateBias) {
    into.late_bias = (into.flags & kUpdateLateBias) ? into.late_bias + u.late_bias : u.late_bias;
  }
  into.flags |= u.flags;
  into.count += u.count;
}

// SPEC 3 step 3: a repeat longer than this counts as this long (so a row costs at most
// context x 50 comparisons).
constexpr int32_t kDryMaxMatch = 50;

}  // namespace

std::vector<TokenUpdate> DryUpdates(const DryPenalty& dry, absl::Span<const int32_t> prompt,
                                    absl::Span<const int32_t> output,
                                    absl::Span<const int32_t> drafts_before) {
  std::vector<TokenUpdate> out;
  if (!dry.on()) return out;
  // The context c is prompt, output, drafts, cut to the last `range` tokens; it is read where
  // it lies (no copy: a 4,096-token context is 16 KB a row).
  const size_t total = prompt.size() + output.size() + drafts_before.size();
  const size_t n = dry.range > 0 ? std::min(total, static_cast<size_t>(dry.range)) : total;
  if (n < 2) return out;
  const size_t first = total - n;  // c[k] is the concatenation's element first + k
  const absl::Span<const int32_t> parts[3] = {prompt, output, drafts_before};
  auto at = [&](size_t k) {
    size_t g = first + k;
    for (const absl::Span<const int32_t>& part : parts) {
      if (g < part.size()) return part[g];
      g -= part.size();
    }
    return int32_t{-1};  // not reached: k < n
  };
  auto breaker = [&dry](int32_t t) {
    return std::binary_search(dry.breakers.begin(), dry.breakers.end(), t);
  };
  // The context's end, which every match is compared with: c[n - 1 - m] = tail[m].
  int32_t tail[kDryMaxMatch + 1];
  const size_t tail_size = std::min(n, static_cast<size_t>(kDryMaxMatch) + 1);
  for (size_t m = 0; m < tail_size; ++m) tail[m] = at(n - 1 - m);
  const int32_t last = tail[0];
  if (breaker(last)) return out;
  // (the token after a match, the match's length) for every match long enough to count.
  std::vector<std::pair<int32_t, int32_t>> matches;
  auto match_at = [&](size_t i) {  // c[i] == last, i <= n - 2
    const int32_t next = at(i + 1);
    if (breaker(next)) return;
    int32_t m = 1;
    while (m < kDryMaxMatch && static_cast<size_t>(m) <= i && at(i - m) == tail[m] &&
           !breaker(tail[m])) {
      ++m;
    }
    if (m >= dry.allowed_length) matches.emplace_back(next, m);
  };
  // Candidates i in [0, n - 2] with c[i] == last, part by part, in blocks whose test has no
  // early exit (the compiler vectorises it): the scan is the cost of a long context.
  size_t k = 0;  // c-index of the part's first element in range
  size_t g = 0;  // concatenation index of the part's start
  for (const absl::Span<const int32_t>& part : parts) {
    const size_t begin = first > g ? std::min(first - g, part.size()) : 0;
    const int32_t* data = part.data();
    constexpr size_t kBlock = 64;
    for (size_t b = begin; b < part.size(); b += kBlock) {
      const size_t e = std::min(part.size(), b + kBlock);
      if (e - b == kBlock) {  // a whole block: a fixed trip count, which -O2 vectorises
        int32_t hits = 0;
        for (size_t j = 0; j < kBlock; ++j) hits |= static_cast<int32_t>(data[b + j] == last);
        if (hits == 0) continue;
      }
      for (size_t j = b; j < e; ++j) {
        const size_t i = k + (j - begin);
        if (data[j] == last && i + 1 < n) match_at(i);
      }
    }
    k += part.size() - begin;
    g += part.size();
  }
  // M[t]: the longest match followed by t.
  std::sort(matches.begin(), matches.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second > b.second);
  });
  for (size_t j = 0; j < matches.size(); ++j) {
    if (j > 0 && matches[j].first == matches[j - 1].first) continue;
    // In float64, rounded to float32 once; subtracting it is adding its negation exactly.
    const double penalty = static_cast<double>(dry.multiplier) *
                           std::pow(static_cast<double>(dry.base),
                                    static_cast<double>(matches[j].second - dry.allowed_length));
    TokenUpdate u = Entry(matches[j].first, kUpdateLateBias);
    u.late_bias = -static_cast<float>(penalty);
    out.push_back(u);
  }
  return out;
}

std::vector<TokenUpdate> RowTokenUpdates(const TokenAdjustments& adjustments,
                                         const PenaltySettings& penalties,
                                         absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> output,
                                         absl::Span<const int32_t> drafts_before) {
  std::vector<TokenUpdate> all;
  // Step 2b: a bad word of one token is always banned; a longer one when the history ends with
  // all of it but its last token.
  for (const std::vector<int32_t>& word : adjustments.bad_words) {
    const absl::Span<const int32_t> prefix(word.data(), word.size() - 1);
    if (HistoryEndsWith(output, drafts_before, prefix)) all.push_back(Entry(word.back(), kUpdateBan));
  }
  // Step 2c: before min_tokens tokens of history, the stop ids are banned.
  if (static_cast<int64_t>(output.size() + drafts_before.size()) < adjustments.min_tokens) {
    for (int32_t t : adjustments.stop_token_ids) all.push_back(Entry(t, kUpdateBan));
  }
  // Step 2d.
  for (const auto& [t, bias] : adjustments.logit_bias) {
    TokenUpdate u = Entry(t, kUpdateBias);
    u.bias = bias;
    all.push_back(u);
  }
  // Step 3's history: every prompt or output token (repetition), counted over the output.
  if (penalties.on()) {
    for (int32_t t : prompt) all.push_back(Entry(t, kUpdatePenalize));
    for (absl::Span<const int32_t> part : {output, drafts_before}) {
      for (int32_t t : part) {
        TokenUpdate u = Entry(t, kUpdatePenalize);
        u.count = 1;
        all.push_back(u);
      }
    }
  }
  // Step 3's DRY, added after the penalties (kUpdateLateBias).
  std::vector<TokenUpdate> dry = DryUpdates(adjustments.dry, prompt, output, drafts_before);
  all.insert(all.end(), dry.begin(), dry.end());
  return MergeTokenUpdates(std::move(all));
}

std::vector<TokenUpdate> MergeTokenUpdates(std::vector<TokenUpdate> entries) {
  std::stable_sort(entries.begin(), entries.end(),
                   [](const TokenUpdate& a, const TokenUpdate& b) { return a.token < b.token; });
  std::vector<TokenUpdate> out;
  for (const TokenUpdate& u : entries) {
    if (out.empty() || out.back().token != u.token) {
      out.push_back(u);
    } else {
      Merge(out.back(), u);
    }
  }
  return out;
}

std::vector<int32_t> DraftsBefore(const RequestInputs& inputs, StepKind kind, int32_t row_index) {
  std::vector<int32_t> drafts;
  if (kind != StepKind::kDecode) return drafts;
  for (int32_t k = 0; k < row_index && k < static_cast<int32_t>(inputs.draft_token_ids.size()); ++k) {
    if (inputs.draft_token_ids[k] >= 0) drafts.push_back(inputs.draft_token_ids[k]);
  }
  return drafts;
}

}  // namespace samplerd
