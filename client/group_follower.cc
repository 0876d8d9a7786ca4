#include "client/group_follower.h"

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"
#include "cuda/nccl_endpoint.h"

namespace samplerd {

absl::StatusOr<std::unique_ptr<GroupFollower>> GroupFollower::Join(const Options& options) {
  if (GroupPacketWords(options.max_step_tokens) < 0) {
    return absl::InvalidArgumentError("max_step_tokens: must be in [1, 2^24], as in CreateGroup");
  }
  if (options.rank < 1 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", options.rank, " is outside [1, ",
                                                   options.world_size - 1, "]"));
  }
  auto endpoint =
      NcclEndpoint::Start(options.unique_id, options.world_size, options.rank, options.device);
  if (!endpoint.ok()) return endpoint.status();
  if (absl::Status joined = (*endpoint)->Wait(options.join_timeout); !joined.ok()) {
    return absl::Status(joined.code(), absl::StrCat("joining the group: ", joined.message()));
  }
  std::unique_ptr<GroupFollower> follower(new GroupFollower(std::move(*endpoint), options));
  SAMPLERD_CUDA_RETURN(cudaSetDevice(options.device));
  const size_t bytes = static_cast<size_t>(follower->packet_words_) * 4;
  SAMPLERD_CUDA_RETURN(cudaMalloc(&follower->device_packet_, bytes));
  SAMPLERD_CUDA_RETURN(cudaMallocHost(&follower->host_packet_, bytes));
  return follower;
}

GroupFollower::GroupFollower(std::unique_ptr<NcclEndpoint> endpoint, const Options& options)
    : endpoint_(std::move(endpoint)),
      options_(options),
      packet_words_(GroupPacketWords(options.max_step_tokens)) {}

GroupFollower::~GroupFollower() {
  cudaSetDevice(options_.device);
  endpoint_.reset();
  if (device_packet_ != nullptr) cudaFree(device_packet_);
  if (host_packet_ != nullptr) cudaFreeHost(host_packet_);
}

absl::Status GroupFollower::ReceiveStepToDevice(int32_t* device_words) {
  absl::Status started =
      endpoint_->StartBroadcast(device_words, static_cast<size_t>(packet_words_), /*root=*/0);
  if (!started.ok()) return started;
  return endpoint_->Wait(options_.op_timeout);
}

absl::StatusOr<GroupFollower::Step> GroupFollower::ReceiveStep() {
  if (absl::Status got = ReceiveStepToDevice(device_packet_); !got.ok()) return got;
  SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(host_packet_, device_packet_,
                                       static_cast<size_t>(packet_words_) * 4,
                                       cudaMemcpyDeviceToHost, endpoint_->stream()));
  SAMPLERD_CUDA_RETURN(cudaStreamSynchronize(endpoint_->stream()));
  auto packet = UnpackGroupPacket(host_packet_, static_cast<size_t>(packet_words_));
  if (!packet.ok()) return packet.status();
  Step step;
  step.closing = (host_packet_[7] & 1) != 0;
  step.packet = std::move(*packet);
  return step;
}

absl::Status GroupFollower::SendLogits(const void* device_data, int64_t bytes, cudaEvent_t ready) {
  if (bytes < 0) return absl::InvalidArgumentError("bytes: negative");
  if (ready != nullptr) SAMPLERD_CUDA_RETURN(cudaStreamWaitEvent(endpoint_->stream(), ready, 0));
  absl::Status started = endpoint_->StartSend(device_data, static_cast<size_t>(bytes), /*peer=*/0);
  if (!started.ok()) return started;
  return endpoint_->Wait(options_.op_timeout);
}

void GroupFollower::Abort() { endpoint_->Abort(); }

}  // namespace samplerd
