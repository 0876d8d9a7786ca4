// Private to cuda/: grow-only device (cudaMalloc) and pinned host (cudaMallocHost) buffers,
// the memory a lane reuses step to step.
#ifndef SAMPLERD_CUDA_DEVICE_BUFFER_H_
#define SAMPLERD_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"
#include "cuda/cuda_status.h"

namespace samplerd {
namespace cuda {

// A grow-only allocation: Reserve(n) reallocates (losing the contents) only when n exceeds the
// size held, so a step of a size seen before allocates nothing.
template <cudaError_t (*kAlloc)(void**, size_t), cudaError_t (*kFree)(void*)>
class GrowBuffer {
 public:
  GrowBuffer() = default;
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  ~GrowBuffer() { Release(); }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    Release();
    SAMPLERD_CUDA_RETURN(kAlloc(&ptr_, std::max<size_t>(bytes, 256)));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  // Frees the memory (a rebuilt lane starts from nothing).
  void Release() {
    if (ptr_ != nullptr) kFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline cudaError_t DeviceAlloc(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
inline cudaError_t PinnedAlloc(void** ptr, size_t bytes) { return cudaMallocHost(ptr, bytes); }
using DeviceBuffer = GrowBuffer<DeviceAlloc, cudaFree>;
using PinnedBuffer = GrowBuffer<PinnedAlloc, cudaFreeHost>;

// `bytes` rounded up to a 256-byte boundary: every array of a lane's input block starts aligned.
inline size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_DEVICE_BUFFER_H_
