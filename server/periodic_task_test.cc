#include "server/periodic_task.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace samplerd {
namespace {

// Runs every period: 10 ms for 300 ms gives about 30 runs (at least 10 on a loaded machine,
// and never one before its first period).
TEST(PeriodicTask, RunsEveryPeriod) {
  std::atomic<int> runs{0};
  {
    PeriodicTask task(absl::Milliseconds(10), [&] { ++runs; });
    EXPECT_EQ(runs.load(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_GE(runs.load(), 10);
  EXPECT_LE(runs.load(), 31);
}

// Destruction never waits out a period (an hour here) and no run starts after it.
TEST(PeriodicTask, StopsAtOnceAndRunsNoMore) {
  std::atomic<int> runs{0};
  const auto start = std::chrono::steady_clock::now();
  { PeriodicTask task(absl::Hours(1), [&] { ++runs; }); }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(runs.load(), 0);
}

// A run in progress finishes before the destructor returns: what it touches outlives it.
TEST(PeriodicTask, LetsARunInProgressFinish) {
  std::atomic<bool> in_run{false}, finished{false};
  {
    PeriodicTask task(absl::Milliseconds(1), [&] {
      in_run = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      finished = true;
    });
    while (!in_run.load()) std::this_thread::yield();
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace samplerd
