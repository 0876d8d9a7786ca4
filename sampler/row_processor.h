// The logits pipeline of SPEC section 3 on one row, and the queries SPEC sections 5-7 make of
// the resulting processed distribution (the CPU backend's per-row engine).
//
// A RowProcessor owns its scratch (a few arrays of the vocabulary's size), so one per worker
// thread keeps memory bounded whatever the batch or prompt length. Process() leaves the
// processed distribution in the processor until the next Process().
//
//   RowProcessor proc;
//   RETURN_IF_ERROR(proc.Process(view, row, options));
//   int32_t token = proc.Draw(UniformDouble(seed, SequenceNumber(pos, DrawCase::kFresh)));
//   float lp = proc.Logprob(token);
//
// The kept set is always a prefix of the order "score descending, ties by lower id" (top-p,
// top-k and min-p each cut that order), so it is held as a cut point, not as a list.
#ifndef SAMPLERD_SAMPLER_ROW_PROCESSOR_H_
#define SAMPLERD_SAMPLER_ROW_PROCESSOR_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "sampler/token_updates.h"
#include "sampler/types.h"
#include "sampler/plan.h"

namespace samplerd {

// What to do with one row.
struct RowOptions {
  const NormalizedParams* params = nullptr;  // required
  int32_t vocab_size = 0;                    // V: columns >= V are padding
  int32_t force_top_n = 0;                   // 0 = off
  const unsigned char* mask = nullptr;       // SPEC 3.2 bitmask; null = unconstrained
  // SPEC 3 steps 2b-d and 3: the row's token updates (sampler/token_updates.h), sorted by
  // token; penalties' settings come from `params`.
  absl::Span<const TokenUpdate> updates;
  // Prompt logprobs use steps 1, 5, 6 and 7 only (no mask, adjustments, penalties, force
  // top-N or min-p).
  bool prompt_mode = false;
  // XTC's uniform for this row (XtcUniform, spec_rules.h): the row removes its top choices
  // when it is < the request's xtc_probability. 1 (the default) never does.
  double xtc_u = 1.0;
  // Keep the raw row for RawLogprob / RawTop (SPEC 7's RAW logprobs mode).
  bool keep_raw = false;
  // Field named in row errors, e.g. "requests[2] row 7".
  const char* field = "";
};

// The row faults of SPEC 3, worded once for every backend. `field` names the request.
absl::Status NonFiniteLogitsError(const std::string& field, int32_t row, int32_t vocab_size);
absl::Status NoTokenLeftError(const std::string& field, int32_t row);
// A logit bias, a penalty or the temperature turned a finite value into +-inf (SPEC 3: an error of the
// request). Worded the same by every backend.
absl::Status ValueOverflowError(const std::string& field, int32_t row);

class RowProcessor {
 public:
  RowProcessor() = default;
  RowProcessor(const RowProcessor&) = delete;
  RowProcessor& operator=(const RowProcessor&) = delete;

  // Runs SPEC 3 steps 1-9 on row `row` of `logits` (host memory).
  // Errors: INVALID_ARGUMENT when a real column is NaN or +inf, when a penalty or the
  // temperature pushes a finite value out of the float32 range, or when no token is left.
  absl::Status Process(const LogitsView& logits, int32_t row, const RowOptions& options);

  // Whether `token` is in the kept set.
  bool Kept(int32_t token) const {
    if (token < 0 || token >= vocab_size_) return false;
    const float s = scores_[token];
    if (head_count_ > 0 && (s > head_score_ || (s == head_score_ && token <= head_token_))) {
      return false;  // removed by XTC
    }
    return s > cut_score_ || (s == cut_score_ && token <= cut_token_);
  }
  // f(t) for each kept token: the sorted kept set in its order, else in token order.
  template <typename F>
  void ForEachKept(F&& f) const {
    if (kept_sorted_) {
      for (int32_t t : kept_) f(t);
      return;
    }
    for (int32_t t = 0; t < vocab_size_; ++t) {
      if (Kept(t)) f(t);
    }
  }
  // Processed logprob of `token`: -inf when removed.
  float Logprob(int32_t token) const {
    if (!Kept(token)) return -std::numeric_limits<float>::infinity();
    return static_cast<float>(static_cast<double>(scores_[token]) - max_score_ - log_kept_sum_);
  }
  // Processed probability of `token` in float64 (0 when removed).
  double Probability(int32_t token) const {
    return Kept(token) ? static_cast<double>(weights_[token]) / kept_sum_ : 0.0;
  }

  // SPEC 7's RAW mode (RowOptions::keep_raw): the raw row's log_softmax at `token` (columns
  // < V, before any step of SPEC 3), and its n largest entries, descending, ties by lower id,
  // padded with (-1, -inf) (a token whose raw logit is -inf is never listed).
  float RawLogprob(int32_t token) const {
    return static_cast<float>(static_cast<double>(raw_[token]) - raw_max_ - raw_log_sum_);
  }
  void RawTop(int32_t n, TopLogprobs* out) const;

  // SPEC 5: the kept token whose cumulative probability (descending order, ties by lower id)
  // first exceeds u; the last kept token if rounding leaves none. u in [0, 1). The order is
  // the scores' (the exact probabilities'), also where two scores share a float32 weight.
  int32_t Draw(double u) const;

  // SPEC 7: the n largest processed logprobs, descending, padded with (-1, -inf).
  void Top(int32_t n, TopLogprobs* out) const;

  // SPEC 7: sum of p_x over x with p_x < p_t, or p_x == p_t and x <= t; 0 when t is removed.
  float SumSmallerProbs(int32_t token) const;

  // With force top-N applied (0 < N < V, not prompt mode): the N surviving token ids, best
  // first; else empty.
  const std::vector<int32_t>& ForceTopNIds() const { return top_n_ids_; }

  // Number of kept tokens.
  int64_t NumKept() const;

  // SPEC 5's draw from weights over the kept tokens: w = weight(token, p_token) >= 0, in the
  // order "w descending, ties by lower id", at cumulative u * sum(w). Returns -1 when every
  // weight is 0. Used for the residual max(0, p - q) of a rejected draft; only kept tokens
  // can have p > 0, so only they are visited.
  int32_t DrawFromKeptWeights(const std::function<double(int32_t, double)>& weight,
                              double u) const;

 private:
  void ApplyMask(const unsigned char* mask);
  // False when a penalty pushed a finite value out of the float32 range.
  // The row's token updates; false when a value left the float32 range.
  bool ApplyTokenUpdates(const RowOptions& options);
  void ApplyForceTopN(int32_t n);
  // Top-p then top-k on the order; sets the cut and the sorted kept prefix.
  void ApplyTopPTopK(float top_p, int32_t top_k);
  void ApplyMinP(float min_p);
  // SPEC 3 step 4's top-nσ on the values before temperature.
  void ApplyTopNSigma(float n);
  // SPEC 3 step 8's XTC removal (its draw already made); kept_sum_ must be current. Whether
  // it removed any token.
  bool ApplyXtc(float threshold);
  // After XTC removed the row's max: the kept tokens' weights, kept_sum_ and max_score_ taken
  // again from the survivors' own max. Against the row's max, survivors far below it (threshold
  // 0 keeps only the least likely token) weigh a subnormal float or 0: a lone survivor 95
  // below the max got logprob 1e-4 instead of 0, one 104 or more below was token -1.
  void RebaseKept();
  void SumKept();
  // Ids of the finite tokens whose cumulative weight in score order first exceeds `mass`,
  // plus every token ranked before them; sorted. May return all finite tokens.
  void PrefixByMass(double mass, std::vector<int32_t>* out) const;
  void SetCutToLastFinite();

  int32_t vocab_size_ = 0;
  std::vector<float> scores_;   // after temperature; -inf = removed before top-p
  std::vector<float> weights_;  // exp(score - max); 0 for -inf
  mutable std::vector<int32_t> ids_;  // scratch
  mutable std::vector<std::pair<double, int32_t>> entries_;  // scratch of DrawFromKeptWeights
  mutable std::vector<double> dense_;                        // scratch of DrawFromKeptWeights
  std::vector<int32_t> top_n_ids_;    // survivors of force top-N
  // Scratch of RebaseKept (the kept set's ids, scores and new weights, contiguous): XTC rows
  // would otherwise allocate three arrays of the kept set's size every step.
  std::vector<int32_t> rebase_ids_;
  std::vector<float> rebase_scores_, rebase_weights_;
  float max_score_ = 0.0f;
  double total_sum_ = 0.0;      // sum of weights of the finite tokens
  // The kept set: tokens ranked at or before (cut_score_, cut_token_).
  float cut_score_ = 0.0f;
  int32_t cut_token_ = 0;
  double kept_sum_ = 1.0;
  double log_kept_sum_ = 0.0;
  // When the kept set was materialised (top-p or top-k active): it, sorted best first.
  bool kept_sorted_ = false;
  std::vector<int32_t> kept_;
  // XTC's removal: the head_count_ tokens ranked at or before (head_score_, head_token_).
  int64_t head_count_ = 0;
  float head_score_ = 0.0f;
  int32_t head_token_ = 0;
  // RAW mode: the row as sent (columns < V), its max and log of sum(exp(x - max)).
  std::vector<float> raw_;
  double raw_max_ = 0.0;
  double raw_log_sum_ = 0.0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_ROW_PROCESSOR_H_
