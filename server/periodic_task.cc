#include "server/periodic_task.h"

#include <utility>

namespace samplerd {

PeriodicTask::PeriodicTask(absl::Duration period, std::function<void()> task) {
  thread_ = std::thread([this, period, task = std::move(task)] {
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), period);
      if (stop_) return;
      mu_.Unlock();  // the task runs unlocked: stopping never waits for more than this run
      task();
      mu_.Lock();
    }
  });
}

PeriodicTask::~PeriodicTask() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

}  // namespace samplerd
