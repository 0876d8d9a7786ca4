// The backend-independent parts of answering a step: what each sampled row contributes, and
// how a request's rows become its result (SPEC 6's accepted prefix, the DRAFT pool). Every
// backend computes RowOutcomes its own way and assembles them here, so the request-level rules
// live in one place.
//
//   StepResult result = BeginStepResult(plan);
//   TakeDecodeDrafts(plan, pool, result, &pool_entries);
//   ... compute outcomes for RowTasks(plan, result) ...
//   AssembleStepResult(plan, tasks, outcomes, prompt_logprobs, pool, result);
#ifndef SAMPLERD_SAMPLER_STEP_ASSEMBLY_H_
#define SAMPLERD_SAMPLER_STEP_ASSEMBLY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "sampler/draft_pool.h"
#include "sampler/types.h"
#include "sampler/validate.h"

namespace samplerd {

// What one sampled row contributes to its request.
struct RowOutcome {
  absl::Status status;
  bool accepted = false;  // DECODE verify rows: the draft was accepted
  int32_t token = -1;     // the accepted draft, or the token emitted if the request stops here
  float logprob = 0.0f;
  TopLogprobs top;
  float sum_smaller = 0.0f;
  DraftRow draft_row;     // DRAFT steps: the distribution the pool keeps
};

// One sampled row of one request: RequestPlan::sampled_rows[index] of requests[request].
struct RowTask {
  int32_t request;
  int32_t index;
};

// A result with each request's id, seed and planned status, nothing computed yet.
StepResult BeginStepResult(const StepPlan& plan);

// For each DECODE request verifying against the pool: takes (consumes) its entry into
// `entries[i]`, or fails the request (FAILED_PRECONDITION) when drafts 1..q-1 are not all there.
void TakeDecodeDrafts(const StepPlan& plan, DraftPool& pool, StepResult& result,
                      std::vector<DraftPool::Entry>* entries);

// The sampled rows of every request still OK in `result`, in request then row order.
std::vector<RowTask> RowTasks(const StepPlan& plan, const StepResult& result);

// Fills `result` from `outcomes` (one per entry of `tasks`, as RowTasks gave them) and
// `prompt_logprobs` (per request): a row fault fails its request; DECODE emits accepted drafts
// then one token; DRAFT rows go into `pool` (RESOURCE_EXHAUSTED for the request that does not
// fit). Requests that failed meanwhile (e.g. in a prompt row) are left as they are.
void AssembleStepResult(const StepPlan& plan, const std::vector<RowTask>& tasks,
                        std::vector<RowOutcome>& outcomes,
                        std::vector<std::vector<float>>& prompt_logprobs, DraftPool& pool,
                        StepResult& result);

// "requests[i]", the prefix of request-level messages.
std::string RequestField(size_t index);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_STEP_ASSEMBLY_H_
