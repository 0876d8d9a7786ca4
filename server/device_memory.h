// What the buffer registry needs from a GPU backend: device memory and events named by CUDA
// IPC handles. server/main.cc implements it over cuda/ (the only target that wires CUDA in);
// with the CPU backend there is none, and CUDA IPC sources answer FAILED_PRECONDITION.
//
//   const void* data; int64_t bytes;
//   ASSIGN_OR_RETURN(auto lease, opener.OpenMemory(handle, byte_size, device, &data, &bytes));
#ifndef SAMPLERD_SERVER_DEVICE_MEMORY_H_
#define SAMPLERD_SERVER_DEVICE_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "server/cuda_ipc_handle.h"

namespace samplerd {

class DeviceMemoryOpener {
 public:
  virtual ~DeviceMemoryOpener() = default;
  // Opens the allocation `handle` names on `device`; byte_size 0 = all of it. Sets the device
  // pointer and the usable bytes; the returned lease keeps the mapping open.
  virtual absl::StatusOr<std::shared_ptr<const void>> OpenMemory(const CudaIpcHandle& handle,
                                                                 int64_t byte_size, int device,
                                                                 const void** data,
                                                                 int64_t* bytes) = 0;
  // Opens an IPC event; `event` is the backend's native event (opaque).
  virtual absl::StatusOr<std::shared_ptr<const void>> OpenEvent(const CudaIpcHandle& handle,
                                                                int device,
                                                                const void** event) = 0;
  // Pins host memory [data, data + bytes) (a registered shm region's read-only mapping) for
  // the device's copies; the lease unpins. An error means the region is copied from pageable
  // memory, slower but correct.
  virtual absl::StatusOr<std::shared_ptr<const void>> PinHostMemory(const void* data,
                                                                    int64_t bytes) = 0;
  virtual int device() const = 0;
  // Whether memory on `peer` (another GPU of this host) is readable from device() by peer
  // access: a tensor-parallel rank's logits shard there is then read in place (issue 47).
  virtual bool CanAccessPeer(int peer) const { return false; }
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_DEVICE_MEMORY_H_
