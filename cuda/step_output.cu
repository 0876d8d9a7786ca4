// Issue 46: the step's tokens into the worker's StepOutput area, on the device (see
// OutputParams in sampling_launch.h). Two launches: the writes, one thread a request; then
// the done word, alone, so that it is stored only once every write has completed (a kernel
// boundary orders them for any later reader on the device, a cuStreamWaitValue32 included).
#include "cuda/sampling_launch.h"

namespace samplerd {
namespace cuda {
namespace detail {

constexpr int kOutputThreads = 128;

__global__ void __launch_bounds__(kOutputThreads) WriteStepOutputKernel(OutputParams p) {
  const int i = blockIdx.x * kOutputThreads + threadIdx.x;
  if (i >= p.num_requests) return;
  const OutputRequest d = p.requests[i];
  bool failed = d.failed != 0;
  for (int j = 0; j < d.rows && !failed; ++j) {
    const RowResult& r = p.results[d.first_job + j];
    failed = r.status != 0 || r.draft_fault != 0;
  }
  for (int j = 0; j < d.prompt_count && !failed; ++j) {
    failed = p.results[d.prompt_first + j].status != 0;
  }
  int written = 0, accepted = 0;
  int32_t* out = p.token_ids == nullptr
                     ? nullptr
                     : p.token_ids + static_cast<int64_t>(i) * p.tokens_per_request;
  if (!failed) {
    // Planning checked tokens_per_request against every request's tokens; the bound on
    // `written` keeps the writes inside the row whatever happens.
    for (int j = 0; j < d.rows && written < p.tokens_per_request; ++j) {
      const RowResult& r = p.results[d.first_job + j];
      if (out != nullptr) out[written] = r.token;
      ++written;
      if (p.decode) {
        if (j + 1 == d.rows || !r.accepted) break;
        ++accepted;
      }
    }
  }
  if (out != nullptr) {
    for (int c = written; c < p.tokens_per_request; ++c) out[c] = -1;
  }
  if (p.num_accepted != nullptr) p.num_accepted[i] = accepted;
}

__global__ void SetDoneWordKernel(unsigned int* word, unsigned int value) {
  *reinterpret_cast<volatile unsigned int*>(word) = value;
  __threadfence_system();
}

}  // namespace detail

cudaError_t LaunchWriteStepOutput(const OutputParams& params, cudaStream_t stream) {
  if (params.num_requests > 0 && (params.token_ids != nullptr || params.num_accepted != nullptr)) {
    if (params.results == nullptr || params.requests == nullptr) return cudaErrorInvalidValue;
    const int blocks = (params.num_requests + detail::kOutputThreads - 1) / detail::kOutputThreads;
    detail::WriteStepOutputKernel<<<blocks, detail::kOutputThreads, 0, stream>>>(params);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (params.done_word != nullptr) {
    detail::SetDoneWordKernel<<<1, 1, 0, stream>>>(params.done_word, params.done_value);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace samplerd
