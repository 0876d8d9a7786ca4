// Private to cuda/: the kernels' row results as the backend-independent outcomes
// (sampler/step_assembly.h): the sampled rows' tokens, logprobs, top logprobs and pool rows,
// the prompt rows' logprobs, and a row's status bits as its request's error, reported in
// SPEC 3's order of checks as the CPU backend does.
#ifndef SAMPLERD_CUDA_JOB_RESULTS_H_
#define SAMPLERD_CUDA_JOB_RESULTS_H_

#include <vector>

#include "cuda/job_builder.h"
#include "cuda/sampling_launch.h"
#include "sampler/step_assembly.h"
#include "sampler/plan.h"

namespace samplerd {
namespace cuda {

struct DecodedResults {
  std::vector<RowOutcome> outcomes;                // one per sampled job, in the jobs' order
  std::vector<std::vector<float>> prompt_logprobs;  // per request, per prompt target
};

// `results` holds one entry per job of `jobs`. A failed prompt row fails its request in
// `result` (the first failure counts).
DecodedResults DecodeJobResults(const StepPlan& plan, const StepJobs& jobs,
                                const std::vector<RowResult>& results, StepResult& result);

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_JOB_RESULTS_H_
