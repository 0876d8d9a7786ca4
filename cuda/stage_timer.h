// Benchmarks only: the kernels' stage times of a step, from the instrumented kernel archive
// (-DSAMPLERD_STAGE_PROBE; //cuda:stage_timer links it, with //cuda:cuda_backend_probed). A
// LaunchProbe the benchmark sets on the backend; the production backend never has one.
//
//   auto timer = std::make_shared<cuda::StageTimer>();
//   gpu->set_launch_probe(timer);
//   gpu->Sample(plan);
//   for (double us : timer->last_stage_us()) ...;   // since the first kernel's start
#ifndef SAMPLERD_CUDA_STAGE_TIMER_H_
#define SAMPLERD_CUDA_STAGE_TIMER_H_

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cuda/device_buffer.h"
#include "cuda/launch_probe.h"
#include "cuda/stage_probe.h"

namespace samplerd {
namespace cuda {

class StageTimer final : public LaunchProbe {
 public:
  // `flags`: cuda::StageProbe::flags (stage-skipping timing experiments; results then wrong).
  explicit StageTimer(int flags = 0) : flags_(flags) {}
  ~StageTimer() override;

  absl::Status BeforeLaunch(cudaStream_t stream) override;
  absl::Status AfterStep(bool split_ran) override;

  // The last step's stage boundaries in microseconds since its first kernel's start (-1: a
  // stage that did not run): the split path's when it ran, else the fused path's.
  std::vector<double> last_stage_us() const;

  // The streaming split kernel's blocks in the last step, where it ran (else empty): where its
  // time goes between rows, e.g. "blocks 384 on 132 SMs; start us p0 p10 p50 p90 p100; time us
  // ..; end us ..; mean end by blocks a SM: 2: 130.2 (24) 3: 145.2 (360)".
  std::string last_block_summary() const;

  // Split job 0's chunks in the last step, where the split path ran (else empty): each stage's
  // mean time over its chunks after the first (the steady state of a streaming block), e.g.
  // "chunks 1-15 mean us: wait 2.1 load 0.4 S1 0.8 S2 0.9 S3 0.5 lists 0.2 gap 0.1; period 5.0".
  std::string last_chunk_summary() const;

 private:
  static std::string BlockSummary(const std::vector<unsigned long long>& block_times);
  static std::string ChunkSummary(const unsigned long long* t);
  static constexpr int kEntries = kProbeEntries;  // StageProbe::stage_times
  static constexpr int kMaxBlocks = 16384;  // StageProbe::block_times: {start, end, SM} each
  const int flags_;
  DeviceBuffer stamps_;  // one step at a time (benchmarks run one lane)
  DeviceBuffer block_stamps_;
  mutable absl::Mutex mu_;
  std::vector<double> stage_us_ ABSL_GUARDED_BY(mu_);
  std::string block_summary_ ABSL_GUARDED_BY(mu_);
  std::string chunk_summary_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_STAGE_TIMER_H_
