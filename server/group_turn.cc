#include "server/group_turn.h"

#include "absl/strings/str_cat.h"
#include "sampler/group_packet.h"

namespace samplerd {

absl::StatusOr<GroupTurn> GroupTurn::Take(GroupRegistry& groups,
                                          const v1::SampleRequest& request) {
  const Clock::time_point start = Clock::now();
  GroupTurn turn;
  // The tensors of the logits that come over NCCL (the logits, or some of its shards).
  const v1::Tensor& logits = request.logits();
  if (logits.has_nccl()) turn.nccl_.emplace_back(&logits, "logits");
  for (int i = 0; i < logits.shards_size(); ++i) {
    if (logits.shards(i).has_nccl()) {
      turn.nccl_.emplace_back(&logits.shards(i), absl::StrCat("logits.shards[", i, "]"));
    }
  }
  turn.broadcasts_ = !request.group_id().empty();
  turn.group_id_ = turn.broadcasts_ ? request.group_id()
                   : turn.nccl_.empty() ? ""
                                        : turn.nccl_[0].first->nccl().group_id();
  if (turn.group_id_.empty()) return turn;
  auto step = groups.BeginStep(turn.group_id_,
                               turn.broadcasts_ ? "group_id" : turn.nccl_[0].second + ".nccl.group_id");
  if (!step.ok()) return step.status();
  turn.step_ = std::move(*step);
  turn.time_ = Clock::now() - start;
  return turn;
}

absl::Status GroupTurn::Receive() {
  if (step_ == nullptr) return absl::OkStatus();
  const Clock::time_point start = Clock::now();
  absl::Status status = absl::OkStatus();
  for (const auto& [tensor, field] : nccl_) {
    if (tensor->nccl().group_id() != step_->group_id()) {
      status = absl::InvalidArgumentError(
          absl::StrCat(field, ".nccl.group_id: '", tensor->nccl().group_id(),
                       "' is not the step's group '", step_->group_id(), "'"));
      break;
    }
    auto layout = TensorLayoutOf(*tensor, field);
    if (!layout.ok()) {
      // The sender's send can never be matched by a receive of the right size.
      step_->FailGroup(
          absl::StrCat("a step's NCCL logits were malformed: ", layout.status().message()));
      status = layout.status();
      break;
    }
    bool on_device = false;
    auto data =
        step_->ReceiveLogits(layout->byte_extent, tensor->nccl().src_rank(), field, &on_device);
    if (!data.ok()) {
      status = data.status();
      break;
    }
    received_[tensor] = {*data, on_device};
  }
  time_ += Clock::now() - start;
  return status;
}

void GroupTurn::Finish(uint64_t step_id, absl::StatusOr<StepResult>& result) {
  if (broadcasts_ && step_ != nullptr) {
    // Every step that held a READY group broadcasts exactly one packet, so followers stay in
    // step with the driver: its results, or its error.
    const int64_t max_tokens = step_->max_step_tokens();
    std::vector<int32_t> words;
    if (result.ok()) {
      auto packed = PackStepResult(*result, max_tokens);
      if (packed.ok()) {
        words = std::move(*packed);
      } else {
        result = packed.status();
      }
    }
    if (!result.ok()) words = PackStepError(step_id, result.status(), max_tokens);
    const Clock::time_point start = Clock::now();
    absl::Status sent = step_->Broadcast(words);
    time_ += Clock::now() - start;
    if (!sent.ok() && result.ok()) result = sent;
  }
  step_.reset();
}

absl::StatusOr<const void*> StepResolver::Resolve(const v1::Tensor& tensor, int64_t byte_extent,
                                                  const std::string& field, bool* on_device,
                                                  std::shared_ptr<const void>* lease,
                                                  std::function<absl::Status()>* verify) {
  if (tensor.source_case() != v1::Tensor::kNccl) {
    return base_.ResolveFor(owner_, tensor, byte_extent, field, on_device, lease, verify);
  }
  auto it = turn_.received().find(&tensor);
  if (it == turn_.received().end()) {  // not reached: every NCCL tensor was received first
    return absl::InternalError(absl::StrCat(field, ": NCCL logits were not received"));
  }
  *on_device = it->second.on_device;
  return it->second.data;
}

}  // namespace samplerd
