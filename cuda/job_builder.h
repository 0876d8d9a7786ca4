// Private to cuda/: a step's plan as the kernels' row jobs. One job per sampled row (in
// RowTasks' order) and, in PREFILL, one per prompt target; each with its token updates, its
// grammar mask and, for a verified draft, where its draft distribution is (the device pool, a
// worker's device tensor read in place, or a dense row built on the host).
#ifndef SAMPLERD_CUDA_JOB_BUILDER_H_
#define SAMPLERD_CUDA_JOB_BUILDER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/device_draft_store.h"
#include "cuda/sampling_launch.h"
#include "sampler/draft_pool.h"
#include "sampler/step_assembly.h"
#include "sampler/plan.h"

namespace samplerd {
namespace cuda {

// A job as the host prepares it, before device pointers are known.
struct HostJob {
  RowJob job;
  int32_t request = 0;
  int32_t index = 0;                   // sampled row index, or prompt target index
  const unsigned char* mask = nullptr;  // host bytes, or null
  // verify: index of the host q row to upload; else job.q_values is already a device row (the
  // pool's, or a worker's read in place: issue 47).
  int32_t q_host = -1;
  const int32_t* q_ids = nullptr;       // a worker's device top-N row: its ids (host, uploaded)
  bool draft_out = false;
  std::shared_ptr<const DeviceDraftRow> pool_row;  // DRAFT: where the kernel writes the row
  std::vector<RowUpdate> updates;  // SPEC 3 steps 2b-d and 3, sorted by token
};

struct StepJobs {
  std::vector<HostJob> jobs;  // the sampled rows, then the prompt rows
  size_t num_sampled = 0;
  std::vector<std::vector<float>> q_rows;  // dense q of the verify jobs whose q is on the host
};

// The jobs of `tasks` (RowTasks(plan, result)) and of the PREFILL prompt targets of requests
// still OK. A DRAFT row's device pool range is allocated here: a request whose range cannot be
// had fails in `result` with the store's error. `pool_entries` are TakeDecodeDrafts' entries.
StepJobs BuildStepJobs(const StepPlan& plan, const std::vector<RowTask>& tasks,
                       const std::vector<DraftPool::Entry>& pool_entries, DeviceDraftStore& store,
                       StepResult& result);

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_JOB_BUILDER_H_
