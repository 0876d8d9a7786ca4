// Private to cuda/: the draft pool's device memory. One slab of the pool's capacity, allocated
// at the first DRAFT step, carved into rows by a RangeAllocator. A DRAFT step's kernel writes
// each row's processed logprobs straight into its range and the DECODE step that verifies it
// reads them there: no copy either way. A row's range is freed by its shared_ptr's deleter, in
// whichever thread drops the last reference (the DECODE step, Release, a row replaced in the
// pool); kernels never read a freed range: the step that writes a row (DRAFT) or reads it
// (DECODE) holds its reference until its own stream has finished, whatever runs on the other
// lanes.
#ifndef SAMPLERD_CUDA_DEVICE_DRAFT_STORE_H_
#define SAMPLERD_CUDA_DEVICE_DRAFT_STORE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sampler/draft_pool.h"
#include "sampler/range_allocator.h"

namespace samplerd {
namespace cuda {

class DeviceDraftStore : public std::enable_shared_from_this<DeviceDraftStore> {
 public:
  // 32 floats: every row starts 128-byte aligned.
  explicit DeviceDraftStore(int64_t capacity_floats) : ranges_(capacity_floats, 32) {}
  ~DeviceDraftStore();
  DeviceDraftStore(const DeviceDraftStore&) = delete;
  DeviceDraftStore& operator=(const DeviceDraftStore&) = delete;

  // A row of `values` floats; RESOURCE_EXHAUSTED when no free range holds it.
  absl::StatusOr<std::shared_ptr<const DeviceDraftRow>> Allocate(int64_t values);

 private:
  absl::Mutex mu_;
  RangeAllocator ranges_ ABSL_GUARDED_BY(mu_);
  float* slab_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_DEVICE_DRAFT_STORE_H_
