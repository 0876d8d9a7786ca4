// The penalty history of one row (SPEC 3.3): every distinct token of prompt ∪ output, with
// how often it occurs in the output. Shared by every backend.
//
//   for (const PenaltyTerm& term : PenaltyTerms(prompt, output, drafts_before_row)) { ... }
#ifndef SAMPLERD_SAMPLER_PENALTIES_H_
#define SAMPLERD_SAMPLER_PENALTIES_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace samplerd {

struct PenaltyTerm {
  int32_t token;
  int32_t count;  // occurrences in output ∪ extra (0: in the prompt only)
};

// Sorted by token. `extra` are further output tokens (a DECODE row's earlier drafts).
std::vector<PenaltyTerm> PenaltyTerms(absl::Span<const int32_t> prompt,
                                      absl::Span<const int32_t> output,
                                      absl::Span<const int32_t> extra);

// Applying a term to a score is sampler/spec_rules.h's ApplyPenalty (shared with the kernels).

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_PENALTIES_H_
