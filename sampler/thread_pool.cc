#include "sampler/thread_pool.h"

namespace samplerd {

ThreadPool::ThreadPool(int num_threads) {
  // The caller works too, so num_threads workers means num_threads - 1 extra threads.
  for (int w = 1; w < num_threads; ++w) threads_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::RunIndices(int worker) {
  for (;;) {
    int64_t i;
    const std::function<void(int64_t, int)>* fn;
    {
      absl::MutexLock lock(&mu_);
      if (fn_ == nullptr || next_ >= n_) return;
      i = next_++;
      fn = fn_;
    }
    (*fn)(i, worker);
    absl::MutexLock lock(&mu_);
    ++done_;
  }
}

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (fn_ != nullptr && generation_ != seen && next_ < n_);
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      seen = generation_;
    }
    RunIndices(worker);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  absl::MutexLock call(&call_mu_);
  if (n == 1 || threads_.empty()) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    done_ = 0;
    ++generation_;
  }
  RunIndices(0);
  absl::MutexLock lock(&mu_);
  auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == n_; };
  mu_.Await(absl::Condition(&finished));
  fn_ = nullptr;
}

}  // namespace samplerd
