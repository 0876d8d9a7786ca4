#include "server/step_channel.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

using channel_layout::FutexWait;
using channel_layout::FutexWake;
using channel_layout::kCapacityAt;
using channel_layout::kClosedByServer;
using channel_layout::kHeaderBytes;
using channel_layout::kMagic;
using channel_layout::kMagicAt;
using channel_layout::kOpen;
using channel_layout::kRequestLenAt;
using channel_layout::kRequestSeqAt;
using channel_layout::kResponseLenAt;
using channel_layout::kResponseSeqAt;
using channel_layout::kStateAt;
using channel_layout::kVersion;
using channel_layout::kVersionAt;

v1::SampleResponse ErrorResponse(uint64_t step_id, absl::StatusCode code, const std::string& what) {
  v1::SampleResponse response;
  response.set_step_id(step_id);
  response.mutable_error()->set_code(static_cast<int32_t>(code));
  response.mutable_error()->set_message(what);
  return response;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepChannel>> StepChannel::Open(const std::string& shm_name,
                                                               int64_t capacity_bytes,
                                                               const ShmOpenOptions& options,
                                                               StepFn step) {
  // <= 1 GiB a direction: the header's u32 lengths hold it, and 64 + 2 x capacity cannot
  // overflow.
  // At least kMinCapacityBytes: every refusal samplerd writes must fit in the response area.
  constexpr int64_t kMaxCapacity = int64_t{1} << 30;
  if (capacity_bytes < channel_layout::kMinCapacityBytes || capacity_bytes > kMaxCapacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_bytes: ", capacity_bytes, " is outside [",
                     channel_layout::kMinCapacityBytes, ", ", kMaxCapacity, "]"));
  }
  ShmOpenOptions writable = options;
  writable.writable = true;
  auto region = ShmRegion::Open(shm_name, kHeaderBytes + 2 * capacity_bytes, writable);
  if (!region.ok()) return region.status();
  auto channel = std::unique_ptr<StepChannel>(
      new StepChannel(*std::move(region), capacity_bytes, std::move(step)));
  if (absl::Status intact = channel->region_->Intact("shm_name", kHeaderBytes); !intact.ok()) {
    return intact;
  }
  const uint32_t magic = channel->Word(kMagicAt)->load();
  const uint32_t version = channel->Word(kVersionAt)->load();
  const uint32_t capacity = channel->Word(kCapacityAt)->load();
  const uint32_t state = channel->Word(kStateAt)->load();
  if (magic != kMagic || version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shm_name: '", shm_name, "' is not a version ", kVersion, " step channel (magic ",
        magic, ", version ", version, ")"));
  }
  if (capacity != static_cast<uint64_t>(capacity_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_bytes: ", capacity_bytes,
                                                   " differs from the channel header's ", capacity));
  }
  if (state != kOpen) {
    return absl::FailedPreconditionError(absl::StrCat("shm_name: channel '", shm_name,
                                                      "' is closed (state ", state, ")"));
  }
  // The sequence as opened: the worker's first step (sent once Open returned) moves it, even
  // if it lands before the thread first looks.
  const uint32_t opened_at = channel->Word(kRequestSeqAt)->load(std::memory_order_acquire);
  channel->thread_ = std::thread([c = channel.get(), opened_at] { c->Serve(opened_at); });
  return channel;
}

StepChannel::StepChannel(std::unique_ptr<ShmRegion> region, int64_t capacity, StepFn step)
    : region_(std::move(region)), capacity_(capacity), step_(std::move(step)) {}

StepChannel::~StepChannel() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::atomic<uint32_t>* StepChannel::Word(int offset) const {
  return channel_layout::Word(region_->mutable_data(), offset);
}

void StepChannel::Answer(uint32_t seq, const v1::SampleResponse& response) {
  char* base = static_cast<char*>(region_->mutable_data());
  const v1::SampleResponse* answer = &response;
  v1::SampleResponse too_big;
  size_t bytes = response.ByteSizeLong();
  if (static_cast<int64_t>(bytes) > capacity_) {
    // The refusal is small (a step id and a message of under 200 bytes) and Open guarantees
    // kMinCapacityBytes, so it fits; no second refusal is ever needed.
    too_big = ErrorResponse(
        response.step_id(), absl::StatusCode::kResourceExhausted,
        absl::StrCat("the step's response of ", bytes, " bytes exceeds the channel's capacity of ",
                     capacity_, " bytes (open it with a larger capacity_bytes)"));
    answer = &too_big;
    bytes = too_big.ByteSizeLong();
  }
  answer->SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(base + kHeaderBytes + capacity_));
  Word(kResponseLenAt)->store(static_cast<uint32_t>(bytes), std::memory_order_relaxed);
  Word(kResponseSeqAt)->store(seq, std::memory_order_release);
  FutexWake(Word(kResponseSeqAt));
}

void StepChannel::Serve(uint32_t seen) {
  std::atomic<uint32_t>* request_seq = Word(kRequestSeqAt);
  std::vector<char> copy;
  while (!stop_.load()) {
    // Shrunk under us: the handler's zero pages answer every read; stop serving.
    if (!region_->Intact("shm_name", kHeaderBytes + 2 * capacity_).ok()) break;
    if (Word(kStateAt)->load(std::memory_order_acquire) != kOpen) break;
    const uint32_t seq = request_seq->load(std::memory_order_acquire);
    if (seq == seen) {
      FutexWait(request_seq, seen, absl::ToTimespec(kPoll));
      continue;
    }
    seen = seq;
    const uint32_t length = Word(kRequestLenAt)->load(std::memory_order_relaxed);
    v1::SampleResponse response;
    v1::SampleRequest request;
    if (length > capacity_) {
      response = ErrorResponse(0, absl::StatusCode::kInvalidArgument,
                               absl::StrCat("request_len: ", length, " exceeds the channel's "
                                            "capacity of ", capacity_, " bytes"));
    } else {
      // Copied out first: the worker may rewrite its bytes while the step runs.
      copy.assign(static_cast<const char*>(region_->mutable_data()) + kHeaderBytes,
                  static_cast<const char*>(region_->mutable_data()) + kHeaderBytes + length);
      if (!request.ParseFromArray(copy.data(), static_cast<int>(copy.size()))) {
        response = ErrorResponse(0, absl::StatusCode::kInvalidArgument,
                                 "the channel's request bytes are not a SampleRequest");
      } else {
        step_(request, &response);
      }
    }
    steps_.fetch_add(1);
    Answer(seq, response);
  }
  serving_.store(false);
  // Tell a worker that waits on a response that none comes (its futex wait sees the state).
  if (region_->Intact("shm_name", kHeaderBytes).ok()) {
    uint32_t open = kOpen;
    Word(kStateAt)->compare_exchange_strong(open, kClosedByServer);
    FutexWake(Word(kResponseSeqAt));  // woken, it finds the state
  }
}

}  // namespace samplerd
