// The CUDA backend: SPEC's contract computed by samplerd's kernels on one GPU, on the
// backend's own non-blocking streams (one per step in flight). Host logits (inline, shm) are
// copied to the device once per step; device logits (CUDA IPC) are read in place.
//
//   if (CudaDeviceUsable(0)) {
//     ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> gpu, CudaBackend::Create({.device = 0}));
//     ASSIGN_OR_RETURN(StepResult result, gpu->Sample(plan));
//   }
#ifndef SAMPLERD_CUDA_CUDA_BACKEND_H_
#define SAMPLERD_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sampler/backend.h"
#include "sampler/draft_pool.h"

namespace samplerd {
namespace cuda {
class LaunchProbe;
}  // namespace cuda

struct CudaBackendOptions {
  int device = 0;
  DraftPoolOptions draft_pool;
  // Steps on the device at once, each on its own CUDA stream with its own buffers (a "lane"):
  // one step's host work and copies overlap another's kernels. Each lane's buffers grow to the
  // largest step it has run.
  int streams = 4;
  // The StepOutput (issue 46) of a DECODE or PREFILL step of one launch written by the device
  // (WriteStepOutputKernel, then the done word), so the worker's wait does not depend on this
  // process's host; off: written from the host after the results come back (DRAFT steps and
  // steps of several launches always are). Both are checked against the assembled results.
  bool device_step_output = true;
};

// Makes a CUDA context on `device` in this process, as a new worker's would be made (under
// MPS: a new MPS client), and returns what it found ("NVIDIA H200 (sm_90, device 0), MPS
// client"), or the error that refused it (an MPS server that takes no new client answers
// cudaErrorMpsServerNotReady). `samplerd --probe_gpu_context` runs it.
absl::StatusOr<std::string> ProbeDeviceContext(int device);

// Whether CUDA device `device` can be used: false (with the reason in `why`) when there is no
// driver, no device or the device cannot be initialised. Never crashes.
bool CudaDeviceUsable(int device, std::string* why = nullptr);

class CudaBackend final : public Backend {
 public:
  // Errors: UNAVAILABLE when the device cannot be used; INTERNAL for CUDA failures.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // Up to options.streams steps run at once, each on its own stream; further callers wait
  // for a free one. A step's results do not depend on what else runs (batch invariance).
  absl::StatusOr<StepResult> Sample(const StepPlan& plan) override;
  BackendInfo Info() const override;
  int max_concurrent_steps() const override;

  DraftPool& draft_pool() override;
  absl::Status Broken() const override;

  // Benchmarks only: a probe run around every launch (cuda/stage_timer.h: the kernels' stage
  // times, with //cuda:cuda_backend_probed), null = none; and the split path off, every
  // small-top-k row on the fused path (the benchmark's within-run baseline). Set between steps.
  void set_launch_probe(std::shared_ptr<cuda::LaunchProbe> probe);
  void set_split_path(bool on);
  // The split path's streaming kernel from `rows` split rows on (default kSplitStreamRows;
  // INT_MAX: never, 1: always).
  void set_split_stream_rows(int rows);

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CUDA_CUDA_BACKEND_H_
