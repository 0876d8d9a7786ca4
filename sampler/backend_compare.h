// SPEC 8's comparison of a backend's results against the CPU backend's on the same step
// (testonly): status codes and messages equal; tokens equal, except a fresh draw whose u lies
// within 1e-6 of the edge between the two tokens' intervals in the float64 reference's
// distribution (InBoundaryBand); processed logprobs within 1e-5 (values >= -20), top logprobs
// and sum-of-smaller-probs likewise. Used by the CUDA tests and the stress test.
//
//   CompareTally tally;
//   CompareWithCpu(cpu_result, gpu_result, tally, "prefill V=1000", step);  // gtest EXPECTs
#ifndef SAMPLERD_SAMPLER_BACKEND_COMPARE_H_
#define SAMPLERD_SAMPLER_BACKEND_COMPARE_H_

#include <string>

#include "sampler/types.h"

namespace samplerd {

// What a run of comparisons saw.
struct CompareTally {
  int requests = 0, token_mismatches = 0, compared_logprobs = 0;
};

// True when the fresh draw of sampled row `row_index` of request `i` of `step` (no golden
// token) may emit `cpu_token` on one backend and `other_token` on the other: they are
// neighbours in the float64 reference's draw order for that row (its history: the request's
// output, then a DECODE row's earlier drafts) and u lies within 1e-6 of the edge between them.
// `why` says why not, or how far u is from the edge.
bool InBoundaryBand(const Step& step, size_t i, int32_t row_index, int32_t cpu_token,
                    int32_t other_token, std::string* why);

// Compares `other` with `cpu` (both computed from `step`) by SPEC 8, with gtest EXPECTs that
// name `what`; boundary-band tokens are counted in `tally` and printed.
void CompareWithCpu(const StepResult& cpu, const StepResult& other, CompareTally& tally,
                    const std::string& what, const Step& step);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_BACKEND_COMPARE_H_
