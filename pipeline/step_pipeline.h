// The one step pipeline: a SampleRequest to a StepResult, the same way wherever it runs.
// Convert (StepFromProto: checks, sources resolved and leased), plan (PlanConvertedStep: the
// per-request checks, seeds drawn), sample on the backend, then verify what the backend read
// (VerifyAfterRead: an shm object truncated while it was read fails the step). The gRPC service,
// samplerctl run-local, the step fuzzer and the tests' in-process harness all call RunStep, and
// so must any new transport: a stage skipped in one copy (VerifyAfterRead, once) is how copies
// drift.
//
//   StepEnvironment env{.resolver = &registry, .budget = &budget, .limits = limits,
//                       .seeds = RandomSeedSource(), .pool_scope = client};
//   ASSIGN_OR_RETURN(StepResult result, RunStep(request, backend, env));
//   ResultToProto(result, &response);
#ifndef SAMPLERD_PIPELINE_STEP_PIPELINE_H_
#define SAMPLERD_PIPELINE_STEP_PIPELINE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pipeline/proto_convert.h"
#include "samplerd/v1/sampler.pb.h"
#include "sampler/backend.h"
#include "sampler/memory_budget.h"
#include "sampler/types.h"
#include "sampler/validate.h"

namespace samplerd {

// What a step runs against, besides its backend.
struct StepEnvironment {
  // Registered buffers, CUDA IPC and NCCL sources; null: inline logits only.
  LogitsSourceResolver* resolver = nullptr;
  // Memory steps in flight may allocate (shard concatenation); null: unbounded.
  MemoryBudget* budget = nullptr;
  Limits limits;
  // Seeds for requests that send none.
  SeedSource seeds;
  // The draft pool's scope for this step's requests (the client's id; "" in-process).
  std::string pool_scope;
};

// Hooks between the stages, for callers that measure or gate them (the service: step stats,
// waiting for a backend slot). Default: nothing.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Converted and planned; the backend is next.
  virtual void Planned(const ConvertedStep& converted, const StepPlan& plan) {}
  // Around Backend::Sample.
  virtual void BeforeSample() {}
  virtual void AfterSample() {}
};

// Runs `request` on `backend`. A step-level fault (conversion, planning, the backend, a source
// that changed while it was read) is the returned status; per-request faults are in the
// result's request statuses. `keep`, when given and the step converted: receives the converted
// step with the memory its views point into (tests that check answers against the float64
// reference read the step's logits afterwards).
absl::StatusOr<StepResult> RunStep(const v1::SampleRequest& request, Backend& backend,
                                   const StepEnvironment& env, StepObserver* observer = nullptr,
                                   std::unique_ptr<ConvertedStep>* keep = nullptr);

}  // namespace samplerd

#endif  // SAMPLERD_PIPELINE_STEP_PIPELINE_H_
