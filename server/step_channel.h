// A co-located worker's shared-memory step channel (proto: OpenStepChannelRequest says the
// layout): a second transport for steps, beside gRPC, for a worker on the same host. The
// worker writes a serialized SampleRequest into the object and wakes a futex; the channel's
// thread reads it, runs it through the service's step (the same function Sample and
// SampleStream run: one pipeline), writes the serialized SampleResponse back and wakes the
// worker. No gRPC, no thread hop, no copy beyond the two serialisations.
//
// Every word the worker controls is checked: a length past the capacity answers INVALID_ARGUMENT,
// bytes that do not parse too; the request is copied out before it is parsed, so a worker
// rewriting it mid-step changes nothing read twice. A shrunk object (the SIGBUS handler's zero
// pages) closes the channel. The futex wait is bounded (kPoll), so Close() and the server's
// shutdown stop the thread promptly.
//
//   ASSIGN_OR_RETURN(auto channel, StepChannel::Open("/w0-chan", 1 << 20, shm_options, run));
//   ...                       // steps flow until the worker closes it or channel.reset()
#ifndef SAMPLERD_SERVER_STEP_CHANNEL_H_
#define SAMPLERD_SERVER_STEP_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "samplerd/v1/sampler.pb.h"
#include "samplerd/v1/step_channel_layout.h"
#include "server/shm_region.h"

namespace samplerd {

class StepChannel {
 public:
  // The header's words and states: samplerd/v1/step_channel_layout.h.
  static constexpr absl::Duration kPoll = absl::Milliseconds(100);

  // Runs one step: fills `response` (a refused step: its `error`). The service's step.
  using StepFn = std::function<void(const v1::SampleRequest&, v1::SampleResponse*)>;

  // Maps `shm_name` read-write (64 + 2 x capacity bytes; checks as a HOST_SHM registration:
  // name, owner uid, regular file, size), checks the header (magic, version, capacity, state
  // open) and starts serving. Errors name the field (shm_name, capacity_bytes).
  static absl::StatusOr<std::unique_ptr<StepChannel>> Open(const std::string& shm_name,
                                                           int64_t capacity_bytes,
                                                           const ShmOpenOptions& options,
                                                           StepFn step);
  // Stops serving (marks the header closed by the server) and joins the thread.
  ~StepChannel();
  StepChannel(const StepChannel&) = delete;
  StepChannel& operator=(const StepChannel&) = delete;

  // False once the worker closed it or its object shrank: the owner may drop it.
  bool serving() const { return serving_.load(); }
  int64_t steps() const { return steps_.load(); }
  const std::string& name() const { return region_->name(); }

 private:
  StepChannel(std::unique_ptr<ShmRegion> region, int64_t capacity, StepFn step);
  // Serves requests after sequence number `seen`.
  void Serve(uint32_t seen);
  std::atomic<uint32_t>* Word(int offset) const;
  // Answers the request of sequence `seq` with `response`.
  void Answer(uint32_t seq, const v1::SampleResponse& response);

  const std::unique_ptr<ShmRegion> region_;
  const int64_t capacity_;
  const StepFn step_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> serving_{true};
  std::atomic<int64_t> steps_{0};
  std::thread thread_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_STEP_CHANNEL_H_
