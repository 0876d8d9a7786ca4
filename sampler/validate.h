// Validation and normalisation of a step (SPEC sections 1, 2 and 9): the checks that make a
// StepPlan (sampler/plan.h holds the plan itself).
//
// PlanStep checks everything that can be checked without reading logits and turns the step
// into a StepPlan: per request, its normalised parameters, the rows it samples with their
// random-number positions, golden tokens and grammar masks. A fault of the step itself (its
// tensor, row ranges that overlap or exceed the tensor) fails PlanStep; a fault confined to one
// request only sets that request's `status`, and the backend skips it.
//
//   ASSIGN_OR_RETURN(StepPlan plan, PlanStep(step, limits, seed_source));
//   ASSIGN_OR_RETURN(StepResult result, backend.Sample(plan));
#ifndef SAMPLERD_SAMPLER_VALIDATE_H_
#define SAMPLERD_SAMPLER_VALIDATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "sampler/field_checks.h"
#include "sampler/plan.h"
#include "sampler/types.h"

namespace samplerd {

// Checks `step` against SPEC and `limits` and plans it.
// Errors (the step as a whole): INVALID_ARGUMENT for a malformed tensor, a bad vocab_size or
// force_top_n, a row outside the tensor or rows claimed by two requests; RESOURCE_EXHAUSTED
// when the step exceeds `limits`. The message names the field. Per-request faults are
// INVALID_ARGUMENT in that request's `status`.
absl::StatusOr<StepPlan> PlanStep(const Step& step, const Limits& limits,
                                  const SeedSource& seed_source);

// SPEC 6's rule for a draft row: finite logprobs and -inf only. INVALID_ARGUMENT naming
// `field`, the row and the first NaN or +inf among `values` [n], else OK. The one place of the
// rule on every backend: PlanStep applies it to every row a request sends (dense rows over
// their first vocab_size columns, top-N rows' values), whether or not verification would read
// the entry, and TakeDecodeDrafts (step_assembly.h) to every host row taken from the pool.
// Rows in device memory are the CUDA backend's to check, with the same rule.
absl::Status CheckDraftRow(const float* values, int32_t n, int32_t row, const std::string& field);
// The error CheckDraftRow returns: draft row `row` holds NaN (`nan`) or +inf at `entry`. The
// CUDA backend reports a device row's fault (found on the device) with it.
absl::Status BadDraftRowError(const std::string& field, int32_t row, int64_t entry, bool nan);

// SPEC section 2 on one request's parameters: checks, then normalises. `field` prefixes messages.
absl::StatusOr<NormalizedParams> NormalizeParams(const SamplingParams& params,
                                                 const Limits& limits, const std::string& field);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_VALIDATE_H_
