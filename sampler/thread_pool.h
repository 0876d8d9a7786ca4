// A fixed pool of worker threads for data-parallel loops over rows.
//
//   ThreadPool pool(4);
//   pool.ParallelFor(num_rows, [&](int64_t i, int worker) { Process(i, scratch[worker]); });
//
// ParallelFor blocks until every index ran. Which worker runs which index varies, so callers
// must make each index's work independent of the worker (per-worker scratch only).
#ifndef SAMPLERD_SAMPLER_THREAD_POOL_H_
#define SAMPLERD_SAMPLER_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace samplerd {

class ThreadPool {
 public:
  // `num_threads` >= 1 workers; the calling thread also works during ParallelFor.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(i, worker) for i in [0, n); worker in [0, NumWorkers()). Concurrent ParallelFor
  // calls from different threads are serialised.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int)>& fn);

  // Workers a ParallelFor may use, the calling thread included.
  int NumWorkers() const { return static_cast<int>(threads_.size()) + 1; }

 private:
  void WorkerLoop(int worker);
  void RunIndices(int worker);

  std::vector<std::thread> threads_;  // constant after construction

  absl::Mutex call_mu_;  // serialises ParallelFor calls
  absl::Mutex mu_;
  const std::function<void(int64_t, int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_THREAD_POOL_H_
