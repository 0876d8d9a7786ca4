// The Backend interface: what computes a planned step (the CPU backend here; cuda/ implements
// it for GPUs). Backends never see where the logits came from: the step holds a LogitsView.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> backend, CpuBackend::Create({}));
//   ASSIGN_OR_RETURN(StepPlan plan, PlanStep(step, limits, seed_source));
//   ASSIGN_OR_RETURN(StepResult result, backend->Sample(plan));
#ifndef SAMPLERD_SAMPLER_BACKEND_H_
#define SAMPLERD_SAMPLER_BACKEND_H_

#include <string>

#include "absl/status/statusor.h"
#include "sampler/draft_pool.h"
#include "sampler/plan.h"
#include "sampler/types.h"

namespace samplerd {

struct BackendInfo {
  std::string name;    // "cpu" or "cuda"
  std::string device;  // e.g. "2 threads" or "NVIDIA H200 (sm_90)"
  // CUDA: the device context is an MPS client (one GPU context shared with the worker's under
  // an MPS server; a fatal fault of any client then ends them all).
  bool mps = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Computes every request of `plan` whose status is OK. Faults confined to a request (a NaN
  // row, no token left) land in that request's result status; the call itself fails only for
  // faults of the backend (INTERNAL, UNAVAILABLE). Thread-safe: steps may be sampled
  // concurrently. `plan` and its step are borrowed for the duration of the call.
  virtual absl::StatusOr<StepResult> Sample(const StepPlan& plan) = 0;

  virtual BackendInfo Info() const = 0;

  // Steps worth running at once: the service admits this many to Sample together and queues
  // the rest (its queue_us). The CPU backend spreads one step over all its threads: 1.
  virtual int max_concurrent_steps() const { return 1; }

  // The backend's draft pool (internally synchronised): the service releases entries in it.
  virtual DraftPool& draft_pool() = 0;

  // Not OK once the backend can run no step again in this process (a CUDA context left
  // unusable by a sticky fault, or torn down by its MPS server): the process must be replaced.
  // Cheap (a no-op device call on CUDA); main's watchdog calls it periodically.
  virtual absl::Status Broken() const { return absl::OkStatus(); }
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_BACKEND_H_
