#include "pipeline/step_pipeline.h"

namespace samplerd {

namespace {

absl::StatusOr<StepResult> Stages(ConvertedStep& converted, Backend& backend,
                                  const StepEnvironment& env, StepObserver& hooks) {
  converted.step.pool_scope = env.pool_scope;
  auto plan = PlanConvertedStep(converted, env.limits, env.seeds);
  if (!plan.ok()) return plan.status();
  // Each request's history work, on this (the caller's) thread before the backend's slot, so a
  // long context costs its own step and nobody else's; its memory reserved (issue 45).
  std::vector<std::shared_ptr<const void>> history_leases;
  PrepareRowUpdates(*plan, env.limits, env.budget, &history_leases);
  hooks.Planned(converted, *plan);
  hooks.BeforeSample();
  absl::StatusOr<StepResult> result = backend.Sample(*plan);
  hooks.AfterSample();
  if (!result.ok()) return result;
  // A registered shm object truncated while the backend read it: the answers rest on zero
  // pages (the SIGBUS handler kept the process alive), so the step fails.
  if (absl::Status intact = converted.VerifyAfterRead(); !intact.ok()) return intact;
  return result;
}

}  // namespace

absl::StatusOr<StepResult> RunStep(const v1::SampleRequest& request, Backend& backend,
                                   const StepEnvironment& env, StepObserver* observer,
                                   std::unique_ptr<ConvertedStep>* keep) {
  StepObserver none;
  auto converted = StepFromProto(request, env.resolver, env.budget, env.limits);
  if (!converted.ok()) return converted.status();
  absl::StatusOr<StepResult> result =
      Stages(**converted, backend, env, observer != nullptr ? *observer : none);
  if (keep != nullptr) *keep = std::move(*converted);
  return result;
}

}  // namespace samplerd
