// What a context-parallel group needs from its transport: NCCL on GPUs (cuda/nccl_transport),
// an in-process fake in tests (server/fake_group_transport). Narrow on purpose: the group
// state machine, ordering, deadlines and abort handling (server/group_registry) are written
// once against it and unit-tested without a GPU.
//
// Every call is non-blocking: operations are started, then polled. Calls on one GroupComm are
// serialised by its owner, except Abort, which may come from the watchdog at any time.
#ifndef SAMPLERD_SAMPLER_GROUP_TRANSPORT_H_
#define SAMPLERD_SAMPLER_GROUP_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace samplerd {

struct GroupConfig {
  int32_t world_size = 0;         // ranks, samplerd's rank 0 included
  int32_t max_step_tokens = 0;    // sizes the broadcast packet (sampler/group_packet.h)
  int32_t device_id = 0;          // samplerd's CUDA device for the group
  int64_t max_logits_bytes = 0;   // the receive buffer for NCCL logits (0: none)
  absl::Duration join_timeout;    // every rank must have joined by then
  absl::Duration op_timeout;      // each broadcast / receive must complete by then
};

// One communicator, samplerd being rank 0.
class GroupComm {
 public:
  enum class Progress { kPending, kDone };
  virtual ~GroupComm() = default;

  // The join: kDone once every rank joined; an error once it cannot complete.
  virtual absl::StatusOr<Progress> PollJoin() = 0;
  // Starts broadcasting `num_words` int32 words from rank 0 (copied before returning).
  virtual absl::Status StartBroadcast(const int32_t* words, size_t num_words) = 0;
  // Starts receiving `bytes` from `src_rank` into logits_buffer() + `offset`.
  virtual absl::Status StartRecv(int64_t offset, int64_t bytes, int src_rank) = 0;
  // Whether every operation started so far has completed; an error (the transport's
  // asynchronous error, e.g. a peer that vanished) once any cannot.
  virtual absl::StatusOr<Progress> PollOps() = 0;
  // Where received logits land, and whether that is device memory.
  virtual const void* logits_buffer() const = 0;
  virtual bool logits_on_device() const = 0;
  // Stops everything in flight; every later operation fails. Idempotent; any thread.
  virtual void Abort() = 0;
  // Orderly teardown of an idle, healthy communicator, bounded by `timeout` (then aborted).
  virtual absl::Status Finalize(absl::Duration timeout) = 0;
};

class GroupTransport {
 public:
  virtual ~GroupTransport() = default;
  // A new unique id for followers to join with (NCCL: the 128-byte ncclUniqueId).
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;
  // Starts joining `unique_id`'s group as rank 0; PollJoin reports progress.
  virtual absl::StatusOr<std::unique_ptr<GroupComm>> StartJoin(const std::string& unique_id,
                                                               const GroupConfig& config) = 0;
  // For GetServerInfo and logs, e.g. "nccl 2.28.3".
  virtual std::string Describe() const = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_GROUP_TRANSPORT_H_
