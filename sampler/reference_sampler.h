// An independent, deliberately plain float64 implementation of SPEC sections 3, 5 and 7 for
// one row: full stable sort, no shortcuts. Tests compare the CPU backend with it, and the
// benchmark uses it as the full-sort baseline. Not for serving (testonly).
//
//   ReferenceRow ref = ReferenceProcess(raw_logits, params, options);
//   int32_t token = ReferenceDraw(ref, u);
#ifndef SAMPLERD_SAMPLER_REFERENCE_SAMPLER_H_
#define SAMPLERD_SAMPLER_REFERENCE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "sampler/plan.h"

namespace samplerd {

struct ReferenceOptions {
  int32_t vocab_size = 0;
  int32_t force_top_n = 0;
  const unsigned char* mask = nullptr;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> output_tokens;  // including a DECODE row's earlier drafts
  // The request's parameters as sent, for SPEC 3 step 2's token adjustments (null: none);
  // output_tokens is their history too.
  const SamplingParams* sent = nullptr;
  bool prompt_mode = false;
  // XTC's uniform for the row (XtcUniform); 1 never removes anything.
  double xtc_u = 1.0;
};

struct ReferenceRow {
  // false: NaN/+inf in a real column, a value that left float32, or no token left
  bool ok = false;
  std::vector<double> logprobs;    // [V] processed logprobs, -inf when removed
  std::vector<double> probs;       // [V] processed probabilities
  std::vector<int32_t> order;      // kept tokens, probability descending, ties by lower id
  // Smallest distance between top_p and a cumulative sum that decided a top-p cut: rows where
  // this is tiny may legitimately differ from a float32 implementation.
  double top_p_margin = 1.0;
  // Top-nσ: the smallest |x - (M - n·σ)| / max(1, |M|) over the finite values (SPEC's boundary
  // band is 1e-6); XTC: the smallest |p - xtc_threshold| over the kept tokens when it acted.
  double sigma_margin = 1.0;
  double xtc_margin = 1.0;
  // SPEC 7's raw logprobs: log_softmax of the row as sent over columns < V.
  std::vector<double> raw_logprobs;
};

ReferenceRow ReferenceProcess(const std::vector<float>& raw, const NormalizedParams& params,
                              const ReferenceOptions& options);

// SPEC 5. Also reports the distance from u * sum to the nearest interval edge.
int32_t ReferenceDraw(const ReferenceRow& row, double u, double* edge_distance = nullptr);

// SPEC 7: the n largest logprobs as (id, logprob), padded with (-1, -inf).
std::vector<std::pair<int32_t, double>> ReferenceTop(const ReferenceRow& row, int32_t n);

// SPEC 7's RAW top logprobs: the n largest raw logprobs (ties by lower id; -inf never listed),
// padded with (-1, -inf).
std::vector<std::pair<int32_t, double>> ReferenceRawTop(const ReferenceRow& row, int32_t n);

// SPEC 7: sum_smaller_probs of `token`.
double ReferenceSumSmaller(const ReferenceRow& row, int32_t token);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_REFERENCE_SAMPLER_H_
