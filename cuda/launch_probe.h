// Benchmarks and tests only: what runs around a step's launches when one sets it on the CUDA
// backend (CudaBackend::set_launch_probe; cuda/stage_timer.h times stages, and the tests' probe
// fails a launch). The service never sets one, so production launches have nothing of it on
// their path but a null check.
#ifndef SAMPLERD_CUDA_LAUNCH_PROBE_H_
#define SAMPLERD_CUDA_LAUNCH_PROBE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace samplerd {
namespace cuda {

class LaunchProbe {
 public:
  virtual ~LaunchProbe() = default;
  // On the lane's stream, before the launches.
  virtual absl::Status BeforeLaunch(cudaStream_t stream) = 0;
  // After the lane's stream finished the step; `split_ran`: some job took the split path.
  virtual absl::Status AfterStep(bool split_ran) = 0;
  // Where the kernels are launched, after the step's inputs were queued: an error here fails
  // the step as a failed launch does (with the launches' description).
  virtual absl::Status AtLaunch(cudaStream_t /*stream*/) { return absl::OkStatus(); }
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_LAUNCH_PROBE_H_
