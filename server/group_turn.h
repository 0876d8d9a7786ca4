// A step's turn in its context-parallel group, out of the service (issue 48): which group a
// step belongs to (its group_id, else the group its NCCL logits come from), the turn taken,
// its NCCL logits received before anything can refuse the step (the sender has posted its
// send, and the group's next receive must not find it), and for a step that names a group
// exactly one packet broadcast after it (its results, or its error), so followers stay in step
// with the driver. Also the step's resolver: NCCL tensors from what the turn received, the
// rest from the buffer registry as the caller's.
//
//   ASSIGN_OR_RETURN(GroupTurn turn, GroupTurn::Take(groups, request));   // waits for the turn
//   absl::Status received = turn.Receive();
//   StepResolver resolver(registry, scope, turn);
//   absl::StatusOr<StepResult> result = received.ok() ? Compute(resolver) : received;
//   turn.Finish(request.step_id(), result);                                // broadcast, end
#ifndef SAMPLERD_SERVER_GROUP_TURN_H_
#define SAMPLERD_SERVER_GROUP_TURN_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/proto_convert.h"
#include "samplerd/v1/sampler.pb.h"
#include "sampler/types.h"
#include "server/buffer_registry.h"
#include "server/group_registry.h"

namespace samplerd {

class GroupTurn {
 public:
  using Clock = std::chrono::steady_clock;
  struct Received {
    const void* data;
    bool on_device;
  };

  // Waits for the step's turn in its group; no group: a turn that holds nothing. Errors: the
  // group's refusal (not READY, unknown), naming the field that named the group.
  static absl::StatusOr<GroupTurn> Take(GroupRegistry& groups, const v1::SampleRequest& request);

  // Receives the step's NCCL tensors, in order, into the group's buffer (nothing to do without
  // any). A tensor naming another group, or malformed (which also fails the group: no receive
  // can match its send), is the step's error.
  absl::Status Receive();
  // What Receive() got, by tensor.
  const std::map<const v1::Tensor*, Received>& received() const { return received_; }

  // After the step: where it names a group, broadcasts its packet (its results, or its error
  // code); a broadcast that fails fails a step that had succeeded. Ends the turn.
  void Finish(uint64_t step_id, absl::StatusOr<StepResult>& result);

  bool in_group() const { return !group_id_.empty(); }
  // Time in the turn's wait, the receives and the broadcast.
  Clock::duration time() const { return time_; }

 private:
  using NcclTensorList = std::vector<std::pair<const v1::Tensor*, std::string>>;
  GroupTurn() = default;

  std::string group_id_;
  bool broadcasts_ = false;
  NcclTensorList nccl_;
  std::unique_ptr<GroupStep> step_;
  std::map<const v1::Tensor*, Received> received_;
  Clock::duration time_{};
};

// A step's LogitsSourceResolver: NCCL tensors from its turn's received logits, everything else
// from the buffer registry as `owner`'s (regions, one-off handles, events, output regions).
class StepResolver final : public LogitsSourceResolver {
 public:
  StepResolver(BufferRegistry& base, std::string owner, const GroupTurn& turn)
      : base_(base), owner_(std::move(owner)), turn_(turn) {}

  absl::StatusOr<const void*> Resolve(const v1::Tensor& tensor, int64_t byte_extent,
                                      const std::string& field, bool* on_device,
                                      std::shared_ptr<const void>* lease,
                                      std::function<absl::Status()>* verify) override;
  absl::StatusOr<const void*> ResolveReadyEvent(const std::string& handle,
                                                const std::string& field,
                                                std::shared_ptr<const void>* lease) override {
    return base_.ResolveReadyEventFor(owner_, handle, field, lease);
  }
  absl::StatusOr<void*> ResolveOutput(const v1::BufferSlice& slice, int64_t byte_extent,
                                      const std::string& field,
                                      std::shared_ptr<const void>* lease) override {
    return base_.ResolveOutputFor(owner_, slice, byte_extent, field, lease);
  }

 private:
  BufferRegistry& base_;
  const std::string owner_;  // one-off handles the step opens are this client's
  const GroupTurn& turn_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_GROUP_TURN_H_
