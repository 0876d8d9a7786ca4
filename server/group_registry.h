// Context-parallel groups: samplerd is rank 0 of each, and broadcasts every step's packed
// results (sampler/group_packet.h) to the follower ranks, which never speak gRPC. A group may
// also deliver a step's logits from a follower (Tensor.nccl).
//
//   GroupRegistry groups(&transport, options, on_failure);
//   ASSIGN_OR_RETURN(GroupRegistry::Created created, groups.Create(config));
//   ...followers join with created.unique_id...
//   ASSIGN_OR_RETURN(std::unique_ptr<GroupStep> step, groups.BeginStep(created.group_id));
//   ASSIGN_OR_RETURN(const void* logits, step->ReceiveLogits(bytes, /*src_rank=*/1, "logits"));
//   ... sample ...
//   RETURN_IF_ERROR(step->Broadcast(PackStepResult(result, max_step_tokens).value()));
//
// States: JOINING (until every rank joined, bounded by join_timeout) -> READY -> FAILED (an
// error, a missed deadline, or a join timeout: the communicator is aborted) or gone
// (DestroyGroup). Steps naming a group that is not READY fail FAILED_PRECONDITION.
//
// Ordering: a group's steps hold it one at a time, in the order BeginStep was called (its
// "ticket"): receives and the broadcast of one step happen before any of the next, which is
// the order followers post theirs. Different groups never wait for each other.
//
// Deadlines: every operation must complete within the group's op_timeout. The step waiting
// on it polls; a watchdog thread also polls every group (joins, the transport's asynchronous
// errors while idle, overdue operations). On an error or a missed deadline the group's
// communicator is aborted, the steps waiting on it fail UNAVAILABLE naming the group, the
// group turns FAILED, and `on_failure` is called (metrics). Nothing else stops.
#ifndef SAMPLERD_SERVER_GROUP_REGISTRY_H_
#define SAMPLERD_SERVER_GROUP_REGISTRY_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sampler/group_transport.h"

namespace samplerd {

enum class GroupState { kJoining, kReady, kFailed };
const char* GroupStateName(GroupState state);

struct GroupInfo {
  std::string group_id;
  GroupState state = GroupState::kJoining;
  GroupConfig config;
  int64_t steps = 0;        // steps that broadcast to it
  std::string error;        // why it failed
};

class GroupRegistry;
struct Group;

// A step's hold on a group (its turn in the group's order). Released when destroyed.
class GroupStep {
 public:
  ~GroupStep();
  GroupStep(const GroupStep&) = delete;
  GroupStep& operator=(const GroupStep&) = delete;

  // Receives `bytes` of logits from `src_rank` (1 .. world_size - 1) and waits until they
  // arrived; returns where (device memory for NCCL, see on_device). Several calls in one step
  // (shards) land one after another. A receive that cannot match the sender's send (bad rank,
  // more than the group's max_logits_bytes) fails the step INVALID_ARGUMENT naming `field`
  // and fails the group too: its followers' order is broken.
  absl::StatusOr<const void*> ReceiveLogits(int64_t bytes, int src_rank, const std::string& field,
                                            bool* on_device);
  // Broadcasts the step's packet (GroupPacketWords(max_step_tokens) words) and waits until it
  // was sent. UNAVAILABLE naming the group when the group failed meanwhile.
  absl::Status Broadcast(const std::vector<int32_t>& words);

  // Fails the group with `reason`: for a step that cannot keep the group's order (e.g.
  // malformed NCCL logits, whose send no receive can match).
  void FailGroup(const std::string& reason);

  const std::string& group_id() const;
  int64_t max_step_tokens() const;

 private:
  friend class GroupRegistry;
  GroupStep(GroupRegistry* registry, std::shared_ptr<Group> group, uint64_t ticket)
      : registry_(registry), group_(std::move(group)), ticket_(ticket) {}
  absl::Status RunOp(const std::function<absl::Status()>& start, const char* what);

  GroupRegistry* registry_;
  std::shared_ptr<Group> group_;
  uint64_t ticket_;
  int64_t logits_used_ = 0;  // bytes of the receive buffer this step filled
};

class GroupRegistry {
 public:
  struct Options {
    int max_groups = 16;
    int64_t max_logits_bytes = int64_t{1} << 30;      // per group
    // A step emits at most one token per logits row, so the server's max_rows bounds what a
    // packet must hold; this keeps CreateGroup from asking for huge packet buffers (each group
    // holds one in device memory and one in pinned host memory: 16 bytes a token).
    int32_t max_step_tokens = 1 << 20;
    absl::Duration max_join_timeout = absl::Minutes(10);
    absl::Duration default_join_timeout = absl::Seconds(60);
    absl::Duration default_op_timeout = absl::Seconds(10);
    absl::Duration watchdog_interval = absl::Milliseconds(2);
  };
  struct Created {
    std::string group_id;
    std::string unique_id;
    int64_t packet_bytes = 0;
  };

  // `transport` null: groups are unavailable (FAILED_PRECONDITION; e.g. the CPU backend).
  // `on_failure(group_id, reason)` is called once per failed group.
  GroupRegistry(GroupTransport* transport, const Options& options,
                std::function<void(const std::string&, const std::string&)> on_failure = {});
  ~GroupRegistry();  // stops the watchdog, aborts what is left
  GroupRegistry(const GroupRegistry&) = delete;
  GroupRegistry& operator=(const GroupRegistry&) = delete;

  // Validates `config` (fields named as CreateGroupRequest's; zero timeouts take the
  // defaults), makes a unique id and starts joining. At max_groups, the oldest FAILED group
  // no step holds is dropped to make room. INVALID_ARGUMENT, FAILED_PRECONDITION (no
  // transport), RESOURCE_EXHAUSTED (max_groups), or the transport's error. A FAILED group's
  // communicator and buffers are freed as soon as no step holds it.
  absl::StatusOr<Created> Create(GroupConfig config);
  // Ends a group: an idle READY group first broadcasts a closing packet (step status
  // UNAVAILABLE, flags bit 0; followers learn the group ended) and is finalized; otherwise
  // aborted. Steps holding it fail UNAVAILABLE. NOT_FOUND for an unknown id.
  absl::Status Destroy(const std::string& group_id);
  std::vector<GroupInfo> List() const;
  // Takes the group's next turn and waits for it. NOT_FOUND (unknown), FAILED_PRECONDITION
  // (not READY), UNAVAILABLE (it failed while this step waited, or draining). `field` names
  // the request field that named the group.
  absl::StatusOr<std::unique_ptr<GroupStep>> BeginStep(const std::string& group_id,
                                                       const std::string& field);
  // SIGTERM: refuses new steps, waits up to `timeout` for the steps holding groups, then
  // destroys every group (closing packets where idle).
  void Shutdown(absl::Duration timeout);
  // Groups that failed since start (metrics and tests).
  int64_t failures() const { return failures_.load(); }
  bool available() const { return transport_ != nullptr; }
  int max_groups() const { return options_.max_groups; }
  int64_t max_logits_bytes() const { return options_.max_logits_bytes; }
  std::string DescribeTransport() const;

 private:
  friend class GroupStep;
  void Watchdog();
  // Aborts the group's communicator and marks it FAILED with `reason` (once).
  void FailLocked(Group& group, const std::string& reason);
  void DestroyGroup(const std::shared_ptr<Group>& group);

  GroupTransport* const transport_;
  const Options options_;
  const std::function<void(const std::string&, const std::string&)> on_failure_;
  std::atomic<int64_t> failures_{0};
  std::atomic<bool> stopping_{false};

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  absl::Mutex watchdog_mu_;
  bool watchdog_stop_ ABSL_GUARDED_BY(watchdog_mu_) = false;
  std::thread watchdog_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_GROUP_REGISTRY_H_
