#include "server/channel_table.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// A worker's channel object with the layout's header (the proto's OpenStepChannelRequest).
class ChannelObject {
 public:
  ChannelObject()
      : name_("/samplerd-table-test-" + std::to_string(getpid()) + "-" +
              std::to_string(std::random_device{}())) {
    fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, kBytes), 0);
    base_ = static_cast<char*>(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    Word(0)->store(channel_layout::kMagic);
    Word(4)->store(1);
    Word(28)->store(kCapacity);
  }
  ~ChannelObject() {
    munmap(base_, kBytes);
    close(fd_);
    shm_unlink(name_.c_str());
  }
  std::unique_ptr<StepChannel> Open() {
    auto opened = StepChannel::Open(name_, kCapacity, {},
                                    [](const v1::SampleRequest&, v1::SampleResponse*) {});
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? std::move(*opened) : nullptr;
  }
  // The worker closes its channel (the state word) and wakes samplerd's thread.
  void CloseByWorker() {
    Word(24)->store(1);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(Word(8)), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }

 private:
  static constexpr uint32_t kCapacity = channel_layout::kMinCapacityBytes;
  static constexpr int64_t kBytes = 64 + 2 * int64_t{kCapacity};
  std::atomic<uint32_t>* Word(int offset) {
    return reinterpret_cast<std::atomic<uint32_t>*>(base_ + offset);
  }
  std::string name_;
  int fd_ = -1;
  char* base_ = nullptr;
};

TEST(ChannelTable, ReservationsCountAgainstBothLimitsUntilCancelled) {
  ChannelTable table(/*max_channels=*/3, /*max_per_owner=*/2);
  ASSERT_TRUE(table.Reserve("a").ok());
  ASSERT_TRUE(table.Reserve("a").ok());
  const absl::Status mine = table.Reserve("a");
  EXPECT_EQ(mine.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(mine.message(), HasSubstr("this client has 2 step channels open"));
  ASSERT_TRUE(table.Reserve("b").ok());
  const absl::Status all = table.Reserve("c");
  EXPECT_EQ(all.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(all.message(), HasSubstr("3 step channels are open, the server's limit"));
  table.Cancel("b");
  EXPECT_TRUE(table.Reserve("c").ok());
  EXPECT_EQ(table.Size(), 0);  // reservations are not channels
}

TEST(ChannelTable, ConcurrentReservationsNeverExceedTheLimit) {
  ChannelTable table(/*max_channels=*/5, /*max_per_owner=*/100);
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) granted += table.Reserve("o" + std::to_string(t)).ok();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(granted.load(), 5);
}

TEST(ChannelTable, ChannelsAreClosedWithTheirOwnerOrTheirWorker) {
  ChannelTable table(/*max_channels=*/8, /*max_per_owner=*/4);
  ChannelObject a1, a2, b1;
  for (auto [owner, object] : {std::pair<const char*, ChannelObject*>{"a", &a1}, {"a", &a2},
                               {"b", &b1}}) {
    ASSERT_TRUE(table.Reserve(owner).ok());
    auto channel = object->Open();
    ASSERT_NE(channel, nullptr);
    EXPECT_THAT(table.Add(owner, std::move(channel)), HasSubstr("channel-"));
  }
  EXPECT_EQ(table.Size(), 3);
  EXPECT_EQ(table.Owned("a"), 2);
  // Added channels count against the limits as reservations did.
  ASSERT_TRUE(table.Reserve("a").ok());
  ASSERT_TRUE(table.Reserve("a").ok());
  EXPECT_FALSE(table.Reserve("a").ok());
  table.Cancel("a");
  table.Cancel("a");
  EXPECT_EQ(table.DropOwner("a"), 2);
  EXPECT_EQ(table.Owned("a"), 0);
  EXPECT_EQ(table.DropClosed(), 0);  // b's worker still serves it
  b1.CloseByWorker();
  int dropped = 0;
  for (int i = 0; i < 200 && dropped == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    dropped = table.DropClosed();
  }
  EXPECT_EQ(dropped, 1);
  EXPECT_EQ(table.Size(), 0);
}

}  // namespace
}  // namespace samplerd
