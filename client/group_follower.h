// The follower side of a context-parallel group (ranks 1 .. world_size - 1): join from the
// nccl_unique_id the driver got from CreateGroup, then, in step with the driver, send the
// step's logits (when the driver's step names this rank in Tensor.nccl) and receive the
// step's packed results. Followers never speak gRPC. Built where CUDA and NCCL exist.
//
//   GroupFollower::Options options{unique_id, world_size, /*rank=*/1, /*device=*/0, 256};
//   ASSIGN_OR_RETURN(auto follower, GroupFollower::Join(options));
//   while (true) {
//     RETURN_IF_ERROR(follower->SendLogits(logits, bytes));    // if the step reads ours
//     ASSIGN_OR_RETURN(GroupPacket step, follower->ReceiveStep());
//     if (step.closing) break;                                  // DestroyGroup / shutdown
//     ... step.requests[i].token_ids ...
//   }
// Every wait is bounded (Options::op_timeout); a timeout or a transport error aborts the
// communicator and is returned (UNAVAILABLE / DEADLINE_EXCEEDED).
#ifndef SAMPLERD_CLIENT_GROUP_FOLLOWER_H_
#define SAMPLERD_CLIENT_GROUP_FOLLOWER_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sampler/group_packet.h"

namespace samplerd {

class NcclEndpoint;

class GroupFollower {
 public:
  struct Options {
    std::string unique_id;        // CreateGroupResponse.nccl_unique_id
    int world_size = 0;
    int rank = 1;
    int device = 0;               // this rank's CUDA device
    int max_step_tokens = 0;      // as in CreateGroup: fixes the packet size
    absl::Duration join_timeout = absl::Seconds(60);
    absl::Duration op_timeout = absl::Seconds(30);
  };
  // A received step. `closing`: the driver's samplerd ended the group (no more steps).
  struct Step {
    GroupPacket packet;
    bool closing = false;
  };

  // Joins and waits for every rank (bounded by join_timeout).
  static absl::StatusOr<std::unique_ptr<GroupFollower>> Join(const Options& options);
  ~GroupFollower();

  // The next step's packet, copied to host and unpacked.
  absl::StatusOr<Step> ReceiveStep();
  // The next step's packet left in device memory: `device_words` holds packet_words() int32
  // words when this returns (the follower's stream is synchronised with the copy).
  absl::Status ReceiveStepToDevice(int32_t* device_words);
  // Sends `bytes` at `device_data` to samplerd (rank 0), for a step whose Tensor.nccl names
  // this rank; `ready` (optional) is an event the send waits for (the producer's).
  absl::Status SendLogits(const void* device_data, int64_t bytes, cudaEvent_t ready = nullptr);
  int64_t packet_words() const { return packet_words_; }
  // Stops the communicator (e.g. on shutdown); later calls fail.
  void Abort();

 private:
  GroupFollower(std::unique_ptr<NcclEndpoint> endpoint, const Options& options);
  std::unique_ptr<NcclEndpoint> endpoint_;
  const Options options_;
  const int64_t packet_words_;
  int32_t* device_packet_ = nullptr;
  int32_t* host_packet_ = nullptr;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_GROUP_FOLLOWER_H_
