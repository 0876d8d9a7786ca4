// One rank's NCCL communicator, non-blocking, with its own CUDA stream: the piece samplerd's
// group transport (rank 0, cuda/nccl_transport) and the follower library (ranks 1..,
// client/group_follower) share. Operations are started, then polled: every wait is bounded
// by its caller, and Abort stops a communicator whose peer died.
//
//   ASSIGN_OR_RETURN(auto rank, NcclEndpoint::Start(unique_id, world_size, 1, device));
//   RETURN_IF_ERROR(rank->Wait(absl::Seconds(60)));          // the join
//   RETURN_IF_ERROR(rank->StartBroadcast(device_words, n, /*root=*/0));
//   RETURN_IF_ERROR(rank->Wait(absl::Seconds(10)));
#ifndef SAMPLERD_CUDA_NCCL_ENDPOINT_H_
#define SAMPLERD_CUDA_NCCL_ENDPOINT_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sampler/group_transport.h"

namespace samplerd {

class NcclEndpoint {
 public:
  // The group transport's (one enum: nccl_transport passes it through).
  using Progress = GroupComm::Progress;

  // A new ncclUniqueId (128 bytes). The process calling it hosts the bootstrap: rank 0.
  static absl::StatusOr<std::string> NewUniqueId();
  // "nccl 2.28.9" (the library loaded at run time).
  static absl::StatusOr<std::string> Version();
  // Starts joining as `rank` on CUDA `device` (ncclCommInitRankConfig, blocking = 0).
  static absl::StatusOr<std::unique_ptr<NcclEndpoint>> Start(const std::string& unique_id,
                                                             int world_size, int rank, int device);
  ~NcclEndpoint();
  NcclEndpoint(const NcclEndpoint&) = delete;
  NcclEndpoint& operator=(const NcclEndpoint&) = delete;

  // In-place broadcast of `count` int32 words at `device_words` from `root`.
  absl::Status StartBroadcast(void* device_words, size_t count, int root);
  absl::Status StartSend(const void* device_data, size_t bytes, int peer);
  absl::Status StartRecv(void* device_data, size_t bytes, int peer);
  // kDone when the join (after Start) or every operation started so far completed; the error
  // (NCCL's asynchronous error, or CUDA's) once any cannot.
  absl::StatusOr<Progress> Poll();
  // Polls until kDone; aborts and returns DEADLINE_EXCEEDED after `timeout`.
  absl::Status Wait(absl::Duration timeout);
  // Stops everything (ncclCommAbort); later calls fail UNAVAILABLE. Idempotent.
  void Abort();
  // Orderly teardown of an idle communicator within `timeout` (then aborted).
  absl::Status Finalize(absl::Duration timeout);
  bool aborted() const { return comm_ == nullptr; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  explicit NcclEndpoint(int device) : device_(device) {}
  absl::Status Started(ncclResult_t result, const char* what);

  const int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  bool finalized_ = false;
  bool record_pending_ = false;  // an operation was started; its event is not yet recorded
};

}  // namespace samplerd

#endif  // SAMPLERD_CUDA_NCCL_ENDPOINT_H_
