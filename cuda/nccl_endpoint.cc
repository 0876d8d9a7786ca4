#include "cuda/nccl_endpoint.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cuda/cuda_status.h"

namespace samplerd {
namespace {

// ncclResult_t -> Status (UNAVAILABLE: a group's failures are its peers'), with the
// communicator's last error text where there is one.
absl::Status NcclStatus(ncclResult_t result, const char* what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  const bool has_detail = detail != nullptr && *detail != '\0';
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(result),
                                             has_detail ? " (" : "", has_detail ? detail : "",
                                             has_detail ? ")" : ""));
}

}  // namespace

absl::StatusOr<std::string> NcclEndpoint::NewUniqueId() {
  ncclUniqueId id;
  if (absl::Status s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::string> NcclEndpoint::Version() {
  int version = 0;
  if (absl::Status s = NcclStatus(ncclGetVersion(&version), "ncclGetVersion"); !s.ok()) return s;
  return absl::StrCat("nccl ", version / 10000, ".", version / 100 % 100, ".", version % 100);
}

absl::StatusOr<std::unique_ptr<NcclEndpoint>> NcclEndpoint::Start(const std::string& unique_id,
                                                                  int world_size, int rank,
                                                                  int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl_unique_id: ", unique_id.size(),
                                                   " bytes, expected ", sizeof(id.internal)));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  std::unique_ptr<NcclEndpoint> endpoint(new NcclEndpoint(device));
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device));
  SAMPLERD_CUDA_RETURN(cudaStreamCreateWithFlags(&endpoint->stream_, cudaStreamNonBlocking));
  SAMPLERD_CUDA_RETURN(cudaEventCreateWithFlags(&endpoint->event_, cudaEventDisableTiming));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // returns at once: Poll watches the join, Abort can stop it
  const absl::Status started = NcclStatus(
      ncclCommInitRankConfig(&endpoint->comm_, world_size, id, rank, &config),
      "ncclCommInitRankConfig");
  if (!started.ok()) return started;
  return endpoint;
}

NcclEndpoint::~NcclEndpoint() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    if (finalized_) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (event_ != nullptr) cudaEventDestroy(event_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status NcclEndpoint::Started(ncclResult_t result, const char* what) {
  absl::Status status = NcclStatus(result, what, comm_);
  if (status.ok()) record_pending_ = true;
  return status;
}

absl::Status NcclEndpoint::StartBroadcast(void* device_words, size_t count, int root) {
  if (comm_ == nullptr) return absl::UnavailableError("the communicator was aborted");
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device_));
  return Started(ncclBroadcast(device_words, device_words, count, ncclInt32, root, comm_, stream_),
                 "ncclBroadcast");
}

absl::Status NcclEndpoint::StartSend(const void* device_data, size_t bytes, int peer) {
  if (comm_ == nullptr) return absl::UnavailableError("the communicator was aborted");
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device_));
  return Started(ncclSend(device_data, bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
}

absl::Status NcclEndpoint::StartRecv(void* device_data, size_t bytes, int peer) {
  if (comm_ == nullptr) return absl::UnavailableError("the communicator was aborted");
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device_));
  return Started(ncclRecv(device_data, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
}

absl::StatusOr<NcclEndpoint::Progress> NcclEndpoint::Poll() {
  if (comm_ == nullptr) return absl::UnavailableError("the communicator was aborted");
  ncclResult_t state = ncclSuccess;
  if (absl::Status s = NcclStatus(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      !s.ok()) {
    return s;
  }
  if (state == ncclInProgress) return Progress::kPending;
  if (state != ncclSuccess) return NcclStatus(state, "NCCL", comm_);
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device_));
  if (record_pending_) {
    // A non-blocking communicator may still be enqueueing when a call returns
    // (ncclInProgress): the completion event goes on the stream only once it is enqueued.
    record_pending_ = false;
    SAMPLERD_CUDA_RETURN(cudaEventRecord(event_, stream_));
  }
  const cudaError_t query = cudaEventQuery(event_);
  if (query == cudaErrorNotReady) return Progress::kPending;
  if (query != cudaSuccess) return CudaStatus(query, "cudaEventQuery");
  return Progress::kDone;
}

absl::Status NcclEndpoint::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int spins = 0;; ++spins) {
    auto progress = Poll();
    if (!progress.ok()) return progress.status();
    if (*progress == Progress::kDone) return absl::OkStatus();
    if (absl::Now() > deadline) {
      Abort();
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL operation not done after ", absl::ToInt64Milliseconds(timeout),
          " ms: aborted (a peer stopped or vanished?)"));
    }
    if (spins > 200) absl::SleepFor(absl::Microseconds(20));
  }
}

void NcclEndpoint::Abort() {
  if (comm_ == nullptr) return;
  cudaSetDevice(device_);
  ncclCommAbort(comm_);  // frees the communicator; kernels waiting on a dead peer return
  comm_ = nullptr;
}

absl::Status NcclEndpoint::Finalize(absl::Duration timeout) {
  if (comm_ == nullptr) return absl::UnavailableError("the communicator was aborted");
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device_));
  absl::Status status = NcclStatus(ncclCommFinalize(comm_), "ncclCommFinalize", comm_);
  if (status.ok()) status = Wait(timeout);
  if (status.ok()) {
    finalized_ = true;
    return status;
  }
  Abort();
  return status;
}

}  // namespace samplerd
