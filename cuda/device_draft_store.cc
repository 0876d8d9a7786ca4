#include "cuda/device_draft_store.h"

#include <cuda_runtime_api.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace samplerd {
namespace cuda {

DeviceDraftStore::~DeviceDraftStore() {
  if (slab_ != nullptr) cudaFree(slab_);
}

absl::StatusOr<std::shared_ptr<const DeviceDraftRow>> DeviceDraftStore::Allocate(int64_t values) {
  absl::MutexLock lock(&mu_);
  if (slab_ == nullptr && ranges_.capacity() > 0) {
    SAMPLERD_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&slab_),
                                    static_cast<size_t>(ranges_.capacity()) * sizeof(float)));
  }
  const std::optional<int64_t> at = ranges_.Allocate(values);
  if (!at.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "draft pool full: a draft row needs ", ranges_.Reserved(values),
        " elements of device memory, the largest free range has ", ranges_.largest_free(), " (",
        ranges_.capacity() - ranges_.used(), " of ", ranges_.capacity(), " free)"));
  }
  auto* row = new DeviceDraftRow{slab_ + *at, values, ranges_.Reserved(values)};
  std::shared_ptr<DeviceDraftStore> self = shared_from_this();
  return std::shared_ptr<const DeviceDraftRow>(row, [self, offset = *at](const DeviceDraftRow* r) {
    {
      absl::MutexLock lock(&self->mu_);
      self->ranges_.Free(offset);
    }
    delete r;
  });
}

}  // namespace cuda
}  // namespace samplerd
