// Private to cuda/: staging and launching a range of a step's jobs on a lane. The jobs' inputs
// (jobs, path lists, token updates, masks, host q rows) go to the device as one block in one
// copy; each job takes its path from its own parameters (split, fused, or the general
// kernels), never from the batch; the results come back into the pinned block.
#ifndef SAMPLERD_CUDA_JOB_LAUNCH_H_
#define SAMPLERD_CUDA_JOB_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "cuda/job_builder.h"
#include "cuda/lane.h"
#include "cuda/launch_probe.h"
#include "cuda/sampling_launch.h"
#include "sampler/types.h"

namespace samplerd {
namespace cuda {

// A step's StepOutput written by the device right after its launch (issue 46), rather than
// from the host after the results came back: the worker's next forward, waiting on the done
// word, then waits for samplerd's kernels and not for its host.
struct DeviceOutput {
  StepOutputTarget target;
  bool decode = false;
  std::vector<OutputRequest> requests;  // one per request of the step, in order
};

// The device output of `plan`'s step, or nullopt where the host must write it (after
// assembly): a DRAFT step (storing its rows in the pool may still fail a request), a step of
// more than one launch (its results are never on the device together) or of no jobs.
// `result` holds the statuses known before the launch.
std::optional<DeviceOutput> PlanDeviceOutput(const StepPlan& plan, const StepJobs& jobs,
                                             const StepResult& result, size_t max_jobs_per_launch);

struct LaunchOptions {
  bool split_path = true;         // false: every small-top-k row on the fused path (benchmarks)
  // The split path streams its rows (a block a row) from this many split rows on, else a block
  // a chunk (StepParams::split_stream).
  int split_stream_rows = kSplitStreamRows;
  LaunchProbe* probe = nullptr;   // benchmarks
  const DeviceOutput* output = nullptr;  // written after this launch's kernels
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
