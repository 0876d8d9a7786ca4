#include "server/step_channel.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// The worker's side of a channel, written from the proto's description of the layout (not
// from step_channel.cc): creates the object, writes requests, waits for answers.
class Worker {
 public:
  Worker(int64_t capacity, uint32_t magic = channel_layout::kMagic)
      : name_("/samplerd-chan-test-" + std::to_string(getpid()) + "-" +
              std::to_string(std::random_device{}())),
        capacity_(capacity),
        bytes_(64 + 2 * capacity) {
    fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, bytes_), 0);
    base_ = static_cast<char*>(mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    Word(0)->store(magic);
    Word(4)->store(1);
    Word(28)->store(static_cast<uint32_t>(capacity));
  }
  ~Worker() {
    munmap(base_, bytes_);
    close(fd_);
    shm_unlink(name_.c_str());
  }
  std::atomic<uint32_t>* Word(int offset) {
    return reinterpret_cast<std::atomic<uint32_t>*>(base_ + offset);
  }
  // Sends `bytes` claiming `length` bytes, and waits (at most 5 s) for the answer.
  bool Send(const std::string& bytes, uint32_t length, v1::SampleResponse* response) {
    std::memcpy(base_ + 64, bytes.data(), std::min<size_t>(bytes.size(), capacity_));
    Word(16)->store(length);
    const uint32_t seq = Word(8)->load() + 1;
    Word(8)->store(seq, std::memory_order_release);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(Word(8)), FUTEX_WAKE, 1, nullptr, nullptr, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (Word(12)->load(std::memory_order_acquire) != seq) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return response->ParseFromArray(base_ + 64 + capacity_, static_cast<int>(Word(20)->load()));
  }
  bool Send(const v1::SampleRequest& request, v1::SampleResponse* response) {
    const std::string bytes = request.SerializeAsString();
    return Send(bytes, static_cast<uint32_t>(bytes.size()), response);
  }
  void Shrink() { ASSERT_EQ(ftruncate(fd_, 0), 0); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int64_t capacity_, bytes_;
  int fd_ = -1;
  char* base_ = nullptr;
};

// A stand-in for the service's step: answers with the request's step id and one result of 20
// tokens per request (a response larger than its request), so what the channel carried can be
// checked.
void Echo(const v1::SampleRequest& request, v1::SampleResponse* response) {
  response->set_step_id(request.step_id());
  for (const v1::RequestInputs& r : request.inputs().requests()) {
    v1::RequestResult* result = response->add_results();
    result->set_request_id(r.request_id());
    for (int t = 0; t < 20; ++t) result->add_token_ids(1000 + t);
  }
}

v1::SampleRequest Step(uint64_t id, int requests) {
  v1::SampleRequest request;
  request.set_step_id(id);
  for (int i = 0; i < requests; ++i) {
    request.mutable_inputs()->add_requests()->set_request_id("r" + std::to_string(i));
  }
  return request;
}

bool WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 200 && !done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST(StepChannel, CarriesStepsInOrderThroughTheStepFunction) {
  Worker worker(4096);
  auto channel = StepChannel::Open(worker.name(), 4096, {}, Echo);
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (uint64_t id = 1; id <= 50; ++id) {
    v1::SampleResponse response;
    ASSERT_TRUE(worker.Send(Step(id, static_cast<int>(id % 5)), &response));
    EXPECT_EQ(response.step_id(), id);
    EXPECT_EQ(response.results_size(), static_cast<int>(id % 5));
  }
  EXPECT_EQ((*channel)->steps(), 50);
}

TEST(StepChannel, HostileWordsAndBytesFailOnlyTheirStep) {
  constexpr int64_t kCapacity = channel_layout::kMinCapacityBytes;
  Worker worker(kCapacity);
  auto channel = StepChannel::Open(worker.name(), kCapacity, {}, Echo);
  ASSERT_TRUE(channel.ok());
  v1::SampleResponse response;
  // A length past the capacity: answered INVALID_ARGUMENT naming request_len, nothing read.
  ASSERT_TRUE(worker.Send("", 0xFFFFFFFFu, &response));
  EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(response.error().message(), HasSubstr("request_len"));
  // Bytes that are no SampleRequest.
  ASSERT_TRUE(worker.Send(std::string("\xff\xff\xff\xff\x0f", 5), 5, &response));
  EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  // A response larger than the capacity (200 results of 20 tokens): RESOURCE_EXHAUSTED, in
  // place of the response.
  ASSERT_TRUE(worker.Send(Step(7, 200), &response));
  EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(response.step_id(), 7u);
  // The channel still serves.
  ASSERT_TRUE(worker.Send(Step(8, 2), &response));
  EXPECT_EQ(response.step_id(), 8u);
  EXPECT_EQ(response.results_size(), 2);
}

TEST(StepChannel, OpenChecksTheObjectAndTheHeader) {
  constexpr int64_t kMin = channel_layout::kMinCapacityBytes;
  Worker bad_magic(kMin, 0x12345678);
  auto opened = StepChannel::Open(bad_magic.name(), kMin, {}, Echo);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("shm_name"));
  Worker worker(2 * kMin);
  opened = StepChannel::Open(worker.name(), 4 * kMin, {}, Echo);  // larger than the object
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  opened = StepChannel::Open(worker.name(), kMin, {}, Echo);  // not the header's capacity
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("capacity_bytes"));
  opened = StepChannel::Open(worker.name(), 0, {}, Echo);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  opened = StepChannel::Open("/samplerd-chan-test-none", kMin, {}, Echo);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kNotFound);
}

// Issue 45: a capacity of 100 bytes or less was accepted, and a step's response (or the
// refusal saying it was too large, which did not fit either) recursed until the stack
// overflowed. Capacities below the minimum are refused at open, naming the field and the bound.
TEST(StepChannel, RefusesCapacitiesBelowTheMinimum) {
  for (int64_t capacity : {int64_t{16}, int64_t{100}, channel_layout::kMinCapacityBytes - 1}) {
    Worker worker(capacity);
    auto opened = StepChannel::Open(worker.name(), capacity, {}, Echo);
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument) << capacity;
    EXPECT_THAT(std::string(opened.status().message()),
                HasSubstr(absl::StrCat("capacity_bytes: ", capacity, " is outside [",
                                       channel_layout::kMinCapacityBytes)));
  }
  // At the minimum, an empty step and one whose response does not fit are both answered.
  Worker worker(channel_layout::kMinCapacityBytes);
  auto channel = StepChannel::Open(worker.name(), channel_layout::kMinCapacityBytes, {}, Echo);
  ASSERT_TRUE(channel.ok()) << channel.status();
  v1::SampleResponse response;
  ASSERT_TRUE(worker.Send(v1::SampleRequest(), &response));
  EXPECT_FALSE(response.has_error());
  ASSERT_TRUE(worker.Send(Step(9, 300), &response));
  EXPECT_EQ(response.error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
}

TEST(StepChannel, StopsWhenTheWorkerClosesItOrShrinksIt) {
  Worker closing(channel_layout::kMinCapacityBytes);
  auto a = StepChannel::Open(closing.name(), channel_layout::kMinCapacityBytes, {}, Echo);
  ASSERT_TRUE(a.ok());
  closing.Word(24)->store(channel_layout::kClosedByWorker);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(closing.Word(8)), FUTEX_WAKE, 1, nullptr,
          nullptr, 0);
  EXPECT_TRUE(WaitUntil([&] { return !(*a)->serving(); }));

  Worker shrinking(channel_layout::kMinCapacityBytes);
  auto b = StepChannel::Open(shrinking.name(), channel_layout::kMinCapacityBytes, {}, Echo);
  ASSERT_TRUE(b.ok());
  shrinking.Shrink();
  // Noticed within the poll period, without a step and without a fault in this process.
  EXPECT_TRUE(WaitUntil([&] { return !(*b)->serving(); }));
}

TEST(StepChannel, DestroyingItStopsItsThreadAndTellsTheWorker) {
  Worker worker(channel_layout::kMinCapacityBytes);
  auto channel = StepChannel::Open(worker.name(), channel_layout::kMinCapacityBytes, {}, Echo);
  ASSERT_TRUE(channel.ok());
  channel->reset();
  EXPECT_EQ(worker.Word(24)->load(), channel_layout::kClosedByServer);
}

}  // namespace
}  // namespace samplerd
