// A thread that runs a task every period until it is destroyed: the service's reaper (owners
// whose lease ran out, closed step channels, expired drafts). Destruction wakes the thread at
// once (it never waits out a period), lets a run in progress finish, and joins: no run starts
// after the destructor returns.
//
//   PeriodicTask reaper(absl::Milliseconds(250), [&] { ReleaseExpired(); });
#ifndef SAMPLERD_SERVER_PERIODIC_TASK_H_
#define SAMPLERD_SERVER_PERIODIC_TASK_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace samplerd {

class PeriodicTask {
 public:
  // Runs `task` every `period` (the first run one period from now), on a thread of its own.
  PeriodicTask(absl::Duration period, std::function<void()> task);
  ~PeriodicTask();
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

 private:
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PERIODIC_TASK_H_
