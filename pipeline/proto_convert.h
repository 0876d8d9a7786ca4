// Conversion between the samplerd.v1 protos and the core's types: the only place where both
// meet. A SampleRequest becomes a core Step whose logits views point into the request's own
// bytes (inline sources) or into storage a LogitsSourceResolver leases (registered buffers,
// CUDA IPC, NCCL); a StepResult becomes a SampleResponse.
//
// Callers run a step with pipeline/step_pipeline.h (RunStep), which strings these together.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ConvertedStep> converted,
//                    StepFromProto(request, /*resolver=*/nullptr));
//   ASSIGN_OR_RETURN(StepPlan plan, PlanConvertedStep(*converted, limits, seeds));
//   ResultToProto(result, &response);
#ifndef SAMPLERD_PIPELINE_PROTO_CONVERT_H_
#define SAMPLERD_PIPELINE_PROTO_CONVERT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "samplerd/v1/sampler.pb.h"
#include "sampler/memory_budget.h"
#include "sampler/types.h"
#include "sampler/validate.h"

namespace samplerd {

// Resolves the non-inline sources of a Tensor (buffer, cuda_ipc, nccl). Implemented by the
// server's buffer registry; absent in `samplerctl run-local`.
class LogitsSourceResolver {
 public:
  virtual ~LogitsSourceResolver() = default;
  // Returns a pointer to `byte_extent` readable bytes of the source (`byte_extent` is already
  // overflow-checked), and `lease`, which keeps them valid until released. Where the bytes can
  // turn out not to be what the owner wrote (an shm object truncated while it was read), sets
  // `verify`, which the server calls once the backend has read the step. Errors name `field`
  // (NOT_FOUND for an unknown buffer, INVALID_ARGUMENT for a slice past its end,
  // FAILED_PRECONDITION for a source this backend cannot read or one that shrank).
  virtual absl::StatusOr<const void*> Resolve(const v1::Tensor& tensor, int64_t byte_extent,
                                              const std::string& field, bool* on_device,
                                              std::shared_ptr<const void>* lease,
                                              std::function<absl::Status()>* verify) = 0;
  // Opens a device tensor's `ready_event` (a CUDA IPC event handle); returns the native event.
  // Errors name `field`: INVALID_ARGUMENT for a handle of the wrong length,
  // FAILED_PRECONDITION where there is no GPU backend.
  virtual absl::StatusOr<const void*> ResolveReadyEvent(const std::string& handle,
                                                        const std::string& field,
                                                        std::shared_ptr<const void>* lease) = 0;
  // Resolves a StepOutput slice: `byte_extent` writable device bytes of a region the caller
  // registered for output. Errors name `field`: NOT_FOUND (no such region of the caller),
  // FAILED_PRECONDITION (not registered for output), INVALID_ARGUMENT (past its end, or not
  // 4-byte aligned). The default: no output regions here.
  virtual absl::StatusOr<void*> ResolveOutput(const v1::BufferSlice& slice, int64_t byte_extent,
                                              const std::string& field,
                                              std::shared_ptr<const void>* lease);
};

// A Step converted from a SampleRequest, with everything its views point into.
struct ConvertedStep {
  Step step;
  // Faults of single requests found while converting (e.g. a malformed draft tensor): OK, or
  // the status that request is answered with. One per request.
  std::vector<absl::Status> request_faults;
  std::vector<std::unique_ptr<std::vector<unsigned char>>> owned;  // e.g. concatenated shards
  std::vector<std::shared_ptr<const void>> leases;                  // registered regions in use
  // Checks to run after the backend read the step (Resolve's `verify`): a failure fails the
  // step, whose results may rest on bytes the owner did not write.
  std::vector<std::function<absl::Status()>> verify_after_read;

  // Runs verify_after_read; the first failure.
  absl::Status VerifyAfterRead() const;
};

// A tensor's element type, row stride (0 resolved to cols) and byte extent, checked as
// StepFromProto checks them (INVALID_ARGUMENT naming `field`): the bytes its source must hold.
struct TensorLayout {
  DType dtype = DType::kFloat32;
  int64_t row_stride = 0;
  int64_t byte_extent = 0;
};
absl::StatusOr<TensorLayout> TensorLayoutOf(const v1::Tensor& tensor, const std::string& field);

// Converts `request`, which must outlive the result (inline bytes are borrowed, not copied).
// Every tensor's extent is computed with overflow-checked arithmetic and checked against the
// bytes its source holds before a view is built. Memory the conversion allocates (shard
// concatenation) is reserved from `budget` first (null: unbounded; the ConvertedStep holds
// the reservation). Each tensor's declared rows and columns (shards added up) are checked
// against `limits` before its source is resolved or anything reserved or copied. Errors (the
// whole step): INVALID_ARGUMENT for a malformed logits tensor or step kind; NOT_FOUND /
// FAILED_PRECONDITION from the resolver; FAILED_PRECONDITION for a non-inline source when
// `resolver` is null; RESOURCE_EXHAUSTED when the budget is short or a limit is exceeded (a
// draft tensor's: that request's fault only). Messages name the field.
absl::StatusOr<std::unique_ptr<ConvertedStep>> StepFromProto(const v1::SampleRequest& request,
                                                             LogitsSourceResolver* resolver,
                                                             MemoryBudget* budget = nullptr,
                                                             const Limits& limits = Limits{});

// PlanStep, then the conversion's per-request faults applied to the plan.
absl::StatusOr<StepPlan> PlanConvertedStep(const ConvertedStep& converted, const Limits& limits,
                                           const SeedSource& seed_source);

// Fills `response` (step_id and results; timing is the caller's): one RequestResult per
// request, or with `packed` (SampleRequest.packed_results) the same results as arrays in
// `response->packed`.
void ResultToProto(const StepResult& result, v1::SampleResponse* response, bool packed = false);

}  // namespace samplerd

#endif  // SAMPLERD_PIPELINE_PROTO_CONVERT_H_
