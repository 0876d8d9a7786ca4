// An in-process stand-in for NCCL behind GroupTransport, for tests without GPUs: followers
// are objects the test drives (join, receive packets, send logits, die, be slow). Matches
// NCCL's blocking semantics where they matter: a broadcast completes only once every
// follower took it, a receive only once its sender sent, and an operation whose peer stopped
// never completes (the group's deadline must catch it).
#ifndef SAMPLERD_SERVER_FAKE_GROUP_TRANSPORT_H_
#define SAMPLERD_SERVER_FAKE_GROUP_TRANSPORT_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "sampler/group_transport.h"

namespace samplerd {

class FakeGroupHub;
struct FakeGroupState;

// One follower rank of a fake group.
class FakeFollower {
 public:
  // The next broadcast packet, waiting up to `timeout`: DEADLINE_EXCEEDED when none came,
  // UNAVAILABLE once the group was aborted.
  absl::StatusOr<std::vector<int32_t>> Receive(absl::Duration timeout);
  // Sends logits bytes to rank 0 (matched by its next receive from this rank).
  void Send(std::vector<unsigned char> bytes);
  // Stops: takes nothing more (rank 0's operations involving it never complete).
  void Die();
  // Makes rank 0's transport report an asynchronous error (as NCCL does when a peer's
  // connection breaks).
  void RaiseAsyncError(const std::string& message);
  int rank() const { return rank_; }

 private:
  friend class FakeGroupHub;
  FakeFollower(std::shared_ptr<FakeGroupState> group, int rank) : group_(std::move(group)), rank_(rank) {}
  std::shared_ptr<FakeGroupState> group_;
  int rank_;
};

class FakeGroupHub final : public GroupTransport {
 public:
  absl::StatusOr<std::string> NewUniqueId() override;
  absl::StatusOr<std::unique_ptr<GroupComm>> StartJoin(const std::string& unique_id,
                                                       const GroupConfig& config) override;
  std::string Describe() const override { return "fake (in-process)"; }

  // A follower joins `unique_id`'s group as `rank`. NOT_FOUND for an unknown id,
  // INVALID_ARGUMENT for a bad or taken rank.
  absl::StatusOr<FakeFollower*> Join(const std::string& unique_id, int rank);
  // Whether the group's communicator was aborted.
  bool Aborted(const std::string& unique_id);

 private:
  absl::Mutex mu_;
  int next_ = 0;
  std::map<std::string, std::shared_ptr<FakeGroupState>> groups_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<FakeFollower>> followers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_FAKE_GROUP_TRANSPORT_H_
