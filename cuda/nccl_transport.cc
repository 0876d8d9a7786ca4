#include "cuda/nccl_transport.h"

#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"
#include "cuda/nccl_endpoint.h"
#include "sampler/group_packet.h"

namespace samplerd {
namespace {

// Rank 0 of a group: its endpoint, the device packet buffer (with pinned staging for the
// host-packed words) and the receive buffer for NCCL logits.
class NcclComm final : public GroupComm {
 public:
  NcclComm(std::unique_ptr<NcclEndpoint> endpoint, const GroupConfig& config)
      : endpoint_(std::move(endpoint)), config_(config) {}

  ~NcclComm() override {
    cudaSetDevice(endpoint_->device());
    endpoint_.reset();  // the communicator first: nothing may still use the buffers
    if (packet_ != nullptr) cudaFree(packet_);
    if (logits_ != nullptr) cudaFree(logits_);
    if (staging_ != nullptr) cudaFreeHost(staging_);
  }

  absl::Status Allocate() {
    SAMPLERD_CUDA_RETURN(cudaSetDevice(endpoint_->device()));
    const size_t packet_bytes = static_cast<size_t>(GroupPacketBytes(config_.max_step_tokens));
    SAMPLERD_CUDA_RETURN(cudaMalloc(&packet_, packet_bytes));
    SAMPLERD_CUDA_RETURN(cudaMallocHost(&staging_, packet_bytes));
    if (config_.max_logits_bytes > 0) {
      SAMPLERD_CUDA_RETURN(cudaMalloc(&logits_, static_cast<size_t>(config_.max_logits_bytes)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Progress> PollJoin() override { return endpoint_->Poll(); }

  absl::Status StartBroadcast(const int32_t* words, size_t num_words) override {
    if (static_cast<int64_t>(num_words) > GroupPacketWords(config_.max_step_tokens)) {
      return absl::InvalidArgumentError("packet larger than the group's packet buffer");
    }
    SAMPLERD_CUDA_RETURN(cudaSetDevice(endpoint_->device()));
    // The previous operation completed (the registry waits for each), so staging is free.
    std::memcpy(staging_, words, num_words * 4);
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(packet_, staging_, num_words * 4,
                                         cudaMemcpyHostToDevice, endpoint_->stream()));
    return endpoint_->StartBroadcast(packet_, num_words, /*root=*/0);
  }

  absl::Status StartRecv(int64_t offset, int64_t bytes, int src_rank) override {
    if (logits_ == nullptr || offset < 0 || bytes < 0 || offset > config_.max_logits_bytes - bytes) {
      return absl::InvalidArgumentError("receive outside the group's logits buffer");
    }
    return endpoint_->StartRecv(static_cast<char*>(logits_) + offset, static_cast<size_t>(bytes),
                                src_rank);
  }

  absl::StatusOr<Progress> PollOps() override { return endpoint_->Poll(); }
  const void* logits_buffer() const override { return logits_; }
  bool logits_on_device() const override { return true; }
  void Abort() override { endpoint_->Abort(); }
  absl::Status Finalize(absl::Duration timeout) override { return endpoint_->Finalize(timeout); }

 private:
  std::unique_ptr<NcclEndpoint> endpoint_;
  const GroupConfig config_;
  void* packet_ = nullptr;
  void* logits_ = nullptr;
  void* staging_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(int device) {
  auto version = NcclEndpoint::Version();
  if (!version.ok()) return version.status();
  return std::unique_ptr<NcclTransport>(new NcclTransport(device, *version));
}

absl::StatusOr<std::string> NcclTransport::NewUniqueId() { return NcclEndpoint::NewUniqueId(); }

absl::StatusOr<std::unique_ptr<GroupComm>> NcclTransport::StartJoin(const std::string& unique_id,
                                                                    const GroupConfig& config) {
  if (config.device_id != device_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device_id: ", config.device_id, " is not the server's CUDA device ", device_,
        " (rank 0 runs where the backend samples)"));
  }
  auto endpoint = NcclEndpoint::Start(unique_id, config.world_size, /*rank=*/0, device_);
  if (!endpoint.ok()) return endpoint.status();
  auto comm = std::make_unique<NcclComm>(std::move(*endpoint), config);
  if (absl::Status allocated = comm->Allocate(); !allocated.ok()) return allocated;
  return std::unique_ptr<GroupComm>(std::move(comm));
}

}  // namespace samplerd
