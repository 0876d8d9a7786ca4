#include "server/fake_group_transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace samplerd {

// Shared by rank 0's comm and the followers; every field under `mu`.
struct FakeGroupState {
  absl::Mutex mu;
  GroupConfig config;
  std::vector<bool> joined;                           // by rank
  std::vector<bool> dead;                             // by rank
  std::vector<std::deque<std::vector<int32_t>>> inbox;          // packets per rank
  std::vector<std::deque<std::vector<unsigned char>>> outbox;   // sends per rank
  std::vector<unsigned char> logits;                  // rank 0's receive buffer (host)
  int64_t broadcasts_pending_takes = 0;               // followers yet to take the last packet
  struct PendingRecv {
    int64_t offset, bytes;
    int src;
  };
  std::deque<PendingRecv> recvs;
  std::string async_error;
  bool aborted = false;
};

namespace {

class FakeComm final : public GroupComm {
 public:
  explicit FakeComm(std::shared_ptr<FakeGroupState> state) : state_(std::move(state)) {}

  absl::StatusOr<Progress> PollJoin() override {
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) return absl::UnavailableError("aborted");
    for (int r = 1; r < state_->config.world_size; ++r) {
      if (!state_->joined[r]) return Progress::kPending;
    }
    return Progress::kDone;
  }

  absl::Status StartBroadcast(const int32_t* words, size_t num_words) override {
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) return absl::UnavailableError("aborted");
    std::vector<int32_t> packet(words, words + num_words);
    for (int r = 1; r < state_->config.world_size; ++r) state_->inbox[r].push_back(packet);
    state_->broadcasts_pending_takes += state_->config.world_size - 1;
    return absl::OkStatus();
  }

  absl::Status StartRecv(int64_t offset, int64_t bytes, int src_rank) override {
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) return absl::UnavailableError("aborted");
    state_->recvs.push_back({offset, bytes, src_rank});
    return absl::OkStatus();
  }

  absl::StatusOr<Progress> PollOps() override {
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) return absl::UnavailableError("aborted");
    if (!state_->async_error.empty()) return absl::UnavailableError(state_->async_error);
    // Match pending receives with what their senders sent, in order.
    while (!state_->recvs.empty()) {
      const FakeGroupState::PendingRecv recv = state_->recvs.front();
      auto& sent = state_->outbox[recv.src];
      if (sent.empty()) break;
      if (static_cast<int64_t>(sent.front().size()) != recv.bytes) {
        state_->async_error = absl::StrCat("rank ", recv.src, " sent ", sent.front().size(),
                                           " bytes to a receive of ", recv.bytes);
        return absl::UnavailableError(state_->async_error);
      }
      std::memcpy(state_->logits.data() + recv.offset, sent.front().data(), recv.bytes);
      sent.pop_front();
      state_->recvs.pop_front();
    }
    const bool done = state_->recvs.empty() && state_->broadcasts_pending_takes == 0;
    return done ? Progress::kDone : Progress::kPending;
  }

  const void* logits_buffer() const override { return state_->logits.data(); }
  bool logits_on_device() const override { return false; }

  void Abort() override {
    absl::MutexLock lock(&state_->mu);
    state_->aborted = true;
  }

  absl::Status Finalize(absl::Duration) override { return absl::OkStatus(); }

 private:
  std::shared_ptr<FakeGroupState> state_;
};

}  // namespace

absl::StatusOr<std::string> FakeGroupHub::NewUniqueId() {
  absl::MutexLock lock(&mu_);
  return absl::StrCat("fake-unique-id-", next_++);
}

absl::StatusOr<std::unique_ptr<GroupComm>> FakeGroupHub::StartJoin(const std::string& unique_id,
                                                                   const GroupConfig& config) {
  auto state = std::make_shared<FakeGroupState>();
  {
    absl::MutexLock lock(&state->mu);
    state->config = config;
    state->joined.assign(config.world_size, false);
    state->dead.assign(config.world_size, false);
    state->inbox.resize(config.world_size);
    state->outbox.resize(config.world_size);
    state->logits.assign(static_cast<size_t>(config.max_logits_bytes), 0);
  }
  absl::MutexLock lock(&mu_);
  groups_[unique_id] = state;
  return std::unique_ptr<GroupComm>(new FakeComm(state));
}

absl::StatusOr<FakeFollower*> FakeGroupHub::Join(const std::string& unique_id, int rank) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(unique_id);
  if (it == groups_.end()) return absl::NotFoundError("no such fake group");
  FakeGroupState& state = *it->second;
  absl::MutexLock group_lock(&state.mu);
  if (rank < 1 || rank >= state.config.world_size || state.joined[rank]) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is invalid or taken"));
  }
  state.joined[rank] = true;
  followers_.push_back(std::unique_ptr<FakeFollower>(new FakeFollower(it->second, rank)));
  return followers_.back().get();
}

bool FakeGroupHub::Aborted(const std::string& unique_id) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(unique_id);
  if (it == groups_.end()) return false;
  absl::MutexLock group_lock(&it->second->mu);
  return it->second->aborted;
}

absl::StatusOr<std::vector<int32_t>> FakeFollower::Receive(absl::Duration timeout) {
  FakeGroupState& state = *group_;
  absl::MutexLock lock(&state.mu);
  const int rank = rank_;
  auto ready = [&state, rank]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
    return state.aborted || !state.inbox[rank].empty();
  };
  if (!state.mu.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError("no packet");
  }
  if (state.aborted) return absl::UnavailableError("the group was aborted");
  std::vector<int32_t> packet = std::move(state.inbox[rank].front());
  state.inbox[rank].pop_front();
  --state.broadcasts_pending_takes;
  return packet;
}

void FakeFollower::Send(std::vector<unsigned char> bytes) {
  absl::MutexLock lock(&group_->mu);
  if (!group_->dead[rank_]) group_->outbox[rank_].push_back(std::move(bytes));
}

void FakeFollower::Die() {
  absl::MutexLock lock(&group_->mu);
  group_->dead[rank_] = true;
  group_->inbox[rank_].clear();  // its packets are never taken: broadcasts stay pending
}

void FakeFollower::RaiseAsyncError(const std::string& message) {
  absl::MutexLock lock(&group_->mu);
  group_->async_error = message;
}

}  // namespace samplerd
