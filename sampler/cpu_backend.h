// The CPU backend: SPEC's whole contract computed on host memory, rows spread over a thread
// pool. It is the reference the CUDA backend is compared with, and a serving path for tests
// and small vocabularies.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create({.num_threads = 4}));
//   ASSIGN_OR_RETURN(StepResult result, cpu->Sample(plan));
//
// Memory is bounded by (workers x a few vocabulary-sized arrays) plus the draft pool, whatever
// the batch or prompt length: rows are processed one at a time per worker, and prompt logprobs
// in chunks of at most kPromptLogprobChunkRows rows.
#ifndef SAMPLERD_SAMPLER_CPU_BACKEND_H_
#define SAMPLERD_SAMPLER_CPU_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sampler/backend.h"
#include "sampler/draft_pool.h"
#include "sampler/thread_pool.h"

namespace samplerd {

struct CpuBackendOptions {
  int num_threads = 0;  // 0 = the machine's hardware threads
  DraftPoolOptions draft_pool;
};

class CpuBackend final : public Backend {
 public:
  // Errors: INVALID_ARGUMENT for a negative thread count.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const CpuBackendOptions& options);

  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  // Steps are computed one at a time (each uses every worker); concurrent callers queue.
  absl::StatusOr<StepResult> Sample(const StepPlan& plan) override;
  BackendInfo Info() const override;

  DraftPool& draft_pool() override { return draft_pool_; }

 private:
  struct Worker;
  explicit CpuBackend(const CpuBackendOptions& options, int num_threads);

  // Constant after construction.
  const int num_threads_;
  DraftPool draft_pool_;  // internally synchronised

  absl::Mutex mu_;  // one step at a time: the workers' scratch is per step
  ThreadPool pool_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_CPU_BACKEND_H_
