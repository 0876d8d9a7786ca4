#include "cuda/stage_timer.h"

#include "cuda/cuda_status.h"
#include "cuda/stage_probe.h"
#include "sampler/status_macros.h"

namespace samplerd {
namespace cuda {

StageTimer::~StageTimer() { SetStageProbe(StageProbe{}); }

absl::Status StageTimer::BeforeLaunch(cudaStream_t stream) {
  RETURN_IF_ERROR(stamps_.Reserve(kEntries * sizeof(unsigned long long)));
  SAMPLERD_CUDA_RETURN(
      cudaMemsetAsync(stamps_.as<void>(), 0, kEntries * sizeof(unsigned long long), stream));
  StageProbe probe;
  probe.stage_times = stamps_.as<unsigned long long>();
  probe.flags = flags_;
  SAMPLERD_CUDA_RETURN(SetStageProbe(probe));
  return absl::OkStatus();
}

absl::Status StageTimer::AfterStep(bool split_ran) {
  unsigned long long t[kEntries];
  SAMPLERD_CUDA_RETURN(cudaMemcpy(t, stamps_.as<void>(), sizeof(t), cudaMemcpyDeviceToHost));
  // The split path's stages when it ran (from its chunk kernel's start), else the fused one's.
  const int t0 = split_ran ? 9 : 0;
  const std::vector<int> order = split_ran ? std::vector<int>{10, 11, 12, 13, 14, 15, 16, 17}
                                           : std::vector<int>{1, 2, 7, 3, 4, 5, 6};
  absl::MutexLock lock(&mu_);
  stage_us_.clear();
  for (int k : order) stage_us_.push_back(t[k] >= t[t0] ? (t[k] - t[t0]) * 1e-3 : -1.0);
  return absl::OkStatus();
}

std::vector<double> StageTimer::last_stage_us() const {
  absl::MutexLock lock(&mu_);
  return stage_us_;
}

}  // namespace cuda
}  // namespace samplerd
