// Private to cuda/: staging and launching a range of a step's jobs on a lane. The jobs' inputs
// (jobs, path lists, token updates, masks, host q rows) go to the device as one block in one
// copy; each job takes its path from its own parameters (split, fused, or the general
// kernels), never from the batch; the results come back into the pinned block.
#ifndef SAMPLERD_CUDA_JOB_LAUNCH_H_
#define SAMPLERD_CUDA_JOB_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "cuda/job_builder.h"
#include "cuda/lane.h"
#include "cuda/launch_probe.h"
#include "cuda/sampling_launch.h"
#include "sampler/types.h"

namespace samplerd {
namespace cuda {

struct LaunchOptions {
  bool split_path = true;         // false: every small-top-k row on the fused path (benchmarks)
  LaunchProbe* probe = nullptr;   // benchmarks
};

// Runs jobs [begin, end) of `jobs` on `lane`, reading `device_logits`; appends their results
// to `results` and adds the launches' device time to *kernel_us. A failed launch's error names
// every launch of its path (grid, block, shared memory), the lane and the step's shapes.
absl::Status LaunchJobs(Lane& lane, const Step& step, const LogitsView& device_logits,
                        StepJobs& jobs, size_t begin, size_t end, const LaunchOptions& options,
                        std::vector<RowResult>& results, float* kernel_us);

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_JOB_LAUNCH_H_
