// Private to cuda/: a lane, one step in flight on the CUDA backend: its own non-blocking
// stream, events and per-step buffers. Steps on different lanes overlap (one step's host work
// and copies with another's kernels); a lane runs one step at a time. Buffers grow to the
// largest step the lane has run and are then reused: a step of a size seen before allocates
// nothing.
#ifndef SAMPLERD_CUDA_LANE_H_
#define SAMPLERD_CUDA_LANE_H_

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/status/status.h"
#include "cuda/device_buffer.h"
#include "cuda/sampling_launch.h"

namespace samplerd {
namespace cuda {

struct Lane {
  explicit Lane(int index) : index(index) {}
  ~Lane() { Destroy(); }
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  absl::Status Init();
  void Destroy();

  // After a step failed on this lane with a CUDA error (no request's fault: those are in the
  // requests' results): makes the lane safe for the next step. Waits for what its stream still
  // had queued (the next step reuses the staging block and the buffers those copies and kernels
  // use), clears this thread's error, and zeroes the split path's arrival counters (a chunk
  // kernel that stopped part-way would leave them non-zero). Where the stream cannot be waited
  // for, the lane is rebuilt: new stream and events, every buffer freed. OK when the lane is
  // usable; otherwise the reason, and `broken` is set so that the next step on it tries again
  // before using it. An error that poisons the whole context (e.g. an illegal address) makes
  // every later step fail with INTERNAL; only a restart clears it.
  absl::Status Recover();

  const int index;  // in the backend's lanes, for error messages
  bool broken = false;  // Recover failed: rebuild before the next step uses it
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  // logits: host logits copied to the device. inputs_d: everything else a launch reads or
  // zero-fills, as one block (jobs, job lists, token updates, masks, q rows, results, row
  // maxima) staged in `staging` with the same layout and sent with one copy.
  DeviceBuffer logits, inputs_d, workspace, split_d;
  // The split path's per-row arrival counters: zeroed when allocated, and every launch leaves
  // them zero (StepParams::split_arrivals), so no per-step memset.
  DeviceBuffer split_arrivals_d;
  int split_arrival_slots = 0;
  PinnedBuffer staging;
  std::vector<RowUpdate> updates;  // the launch's token updates, reused step to step
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_LANE_H_
