// The CUDA backend: SPEC's contract computed by samplerd's kernels on one GPU, on the
// backend's own non-blocking stream. Host logits (inline, shm) are staged through pinned
// memory; device logits (CUDA IPC) are read in place.
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

struct CudaBackendOptions {
  int device = 0;
  DraftPoolOptions draft_pool;
};

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

  // Steps run one at a time on the backend's stream; concurrent callers queue.
  absl::StatusOr<StepResult> Sample(const StepPlan& plan) override;
  BackendInfo Info() const override;

  DraftPool& draft_pool() override;

  // Kernel time of the last step, in microseconds (CUDA events around the launches).
  float last_kernel_us() const;
  // Benchmarks: record the kernels' stage times (ns since their start) of the next steps; needs
  // the instrumented kernels (link //cuda:cuda_backend_probed; the production backend's steps
  // then fail INTERNAL). `debug_flags`: the low byte is cuda::StageProbe::flags (timing
  // experiments only); kDebugNoSplitPath puts every row on the fused path (either build).
  static constexpr int kDebugNoSplitPath = 1 << 8;
  void set_stage_timing(bool on, int debug_flags = 0);
  std::vector<double> last_stage_us() const;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CUDA_CUDA_BACKEND_H_
