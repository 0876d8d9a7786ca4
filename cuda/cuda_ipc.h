// What the buffer registry opens on the server's device for a model worker's memory: its
// CUDA IPC memory and events, and its host shared memory pinned for the device's copies.
// Host header: no CUDA types in it.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<CudaIpcMemory> mem,
//                    CudaIpcMemory::Open(handle_bytes, /*byte_size=*/n, /*device=*/0));
//   const void* logits = mem->data();  // device pointer, valid until mem is destroyed
#ifndef SAMPLERD_CUDA_CUDA_IPC_H_
#define SAMPLERD_CUDA_CUDA_IPC_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace samplerd {

class CudaIpcMemory final {
 public:
  // Opens the 64-byte cudaIpcMemHandle_t `handle` (cudaIpcMemLazyEnablePeerAccess) on
  // `device`. `byte_size` (> 0) must fit in the allocation the handle names, which is measured
  // (cuMemGetAddressRange); byte_size 0 means "the whole allocation".
  // Errors: INVALID_ARGUMENT (byte_size larger than the allocation), FAILED_PRECONDITION (the
  // handle cannot be opened: another device, a closed allocation, the same process), INTERNAL.
  static absl::StatusOr<std::unique_ptr<CudaIpcMemory>> Open(const char* handle, int64_t byte_size,
                                                             int device);
  ~CudaIpcMemory();
  CudaIpcMemory(const CudaIpcMemory&) = delete;
  CudaIpcMemory& operator=(const CudaIpcMemory&) = delete;

  const void* data() const { return data_; }
  int64_t byte_size() const { return byte_size_; }
  int64_t allocation_bytes() const { return allocation_bytes_; }

 private:
  CudaIpcMemory(void* data, int64_t byte_size, int64_t allocation_bytes)
      : data_(data), byte_size_(byte_size), allocation_bytes_(allocation_bytes) {}
  void* data_;
  int64_t byte_size_;
  int64_t allocation_bytes_;
};

// Whether `device` can read memory on `peer` (another GPU of this host) by peer access; false
// for the same device or one that does not exist.
bool CudaCanAccessPeer(int device, int peer);

// A CUDA IPC event handle opened in this process: the server's stream waits on it before
// reading the logits its producer wrote.
class CudaIpcEvent final {
 public:
  static absl::StatusOr<std::unique_ptr<CudaIpcEvent>> Open(const char* handle, int device);
  ~CudaIpcEvent();
  CudaIpcEvent(const CudaIpcEvent&) = delete;
  CudaIpcEvent& operator=(const CudaIpcEvent&) = delete;
  // The cudaEvent_t, as an opaque pointer (LogitsView::ready_event).
  const void* native() const { return event_; }

 private:
  explicit CudaIpcEvent(void* event) : event_(event) {}
  void* event_;
};

// Host memory (a registered shm region's mapping) page-locked for the device's copies, so a
// step's logits cross PCIe by DMA at full speed instead of through the driver's pageable
// staging. Pinning costs time in proportion to the size, once, at registration.
// A read-only mapping is pinned with cudaHostRegisterReadOnly. If the owner shrinks the object
// while it is pinned, the pinned pages stay (the device reads the old bytes, never another
// process's memory) and the step is failed by the region's size check after the read.
class PinnedHostMemory final {
 public:
  // FAILED_PRECONDITION when the driver refuses (e.g. read-only registration unsupported);
  // the caller then copies from pageable memory.
  static absl::StatusOr<std::unique_ptr<PinnedHostMemory>> Pin(const void* data, int64_t bytes,
                                                               int device, bool read_only);
  ~PinnedHostMemory();
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;

 private:
  PinnedHostMemory(void* data, int device) : data_(data), device_(device) {}
  void* data_;
  int device_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CUDA_CUDA_IPC_H_
