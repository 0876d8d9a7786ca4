#include "cuda/cuda_ipc.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace samplerd {
namespace {

// cuMemGetAddressRange from the driver, found through the runtime (so samplerd does not link
// libcuda and still starts where there is no driver).
using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

absl::StatusOr<GetAddressRangeFn> AddressRangeFn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult query;
  const cudaError_t error = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                              cudaEnableDefault, &query);
  if (error != cudaSuccess || query != cudaDriverEntryPointSuccess || fn == nullptr) {
    return absl::InternalError("cuMemGetAddressRange is not available from the CUDA driver");
  }
  return reinterpret_cast<GetAddressRangeFn>(fn);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcMemory>> CudaIpcMemory::Open(const char* handle,
                                                                   int64_t byte_size, int device) {
  if (byte_size < 0) return absl::InvalidArgumentError("byte_size: must be >= 0");
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) {
    return CudaStatus(error, absl::StrCat("device_id: ", device),
                      absl::StatusCode::kFailedPrecondition);
  }
  cudaIpcMemHandle_t ipc;
  static_assert(sizeof(ipc) == 64, "cudaIpcMemHandle_t is 64 bytes");
  std::memcpy(&ipc, handle, sizeof(ipc));
  void* data = nullptr;
  error = cudaIpcOpenMemHandle(&data, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, absl::StrCat("cuda_ipc_handle: cannot open the handle on device ", device),
                      absl::StatusCode::kFailedPrecondition);
  }
  auto range = AddressRangeFn();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!range.ok() || (*range)(&base, &size, reinterpret_cast<CUdeviceptr>(data)) != CUDA_SUCCESS) {
    cudaIpcCloseMemHandle(data);
    return absl::InternalError("cuda_ipc_handle: cannot measure the allocation it names");
  }
  // The handle names an allocation; the mapping starts at its base.
  const int64_t available =
      static_cast<int64_t>(size) - static_cast<int64_t>(reinterpret_cast<CUdeviceptr>(data) - base);
  if (byte_size > available) {
    cudaIpcCloseMemHandle(data);
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_size: ", byte_size, " exceeds the ", available, " bytes of the allocation"));
  }
  return std::unique_ptr<CudaIpcMemory>(
      new CudaIpcMemory(data, byte_size == 0 ? available : byte_size, available));
}

CudaIpcMemory::~CudaIpcMemory() { cudaIpcCloseMemHandle(data_); }

bool CudaCanAccessPeer(int device, int peer) {
  int can = 0;
  if (peer == device || cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess) {
    cudaGetLastError();  // an unknown device: not sticky, leave the thread's state clean
    return false;
  }
  return can != 0;
}

absl::StatusOr<std::unique_ptr<CudaIpcEvent>> CudaIpcEvent::Open(const char* handle, int device) {
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) {
    return CudaStatus(error, "device", absl::StatusCode::kFailedPrecondition);
  }
  cudaIpcEventHandle_t ipc;
  static_assert(sizeof(ipc) == 64, "cudaIpcEventHandle_t is 64 bytes");
  std::memcpy(&ipc, handle, sizeof(ipc));
  cudaEvent_t event = nullptr;
  error = cudaIpcOpenEventHandle(&event, ipc);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, "ready_event: cannot open the event handle",
                      absl::StatusCode::kFailedPrecondition);
  }
  return std::unique_ptr<CudaIpcEvent>(new CudaIpcEvent(event));
}

CudaIpcEvent::~CudaIpcEvent() { cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }

absl::StatusOr<std::unique_ptr<PinnedHostMemory>> PinnedHostMemory::Pin(const void* data,
                                                                      int64_t bytes, int device,
                                                                      bool read_only) {
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device));
  void* ptr = const_cast<void*>(data);
  const unsigned int flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0);
  const cudaError_t error = cudaHostRegister(ptr, static_cast<size_t>(bytes), flags);
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky; leave the thread's error state clean
    return CudaStatus(error, "cudaHostRegister", absl::StatusCode::kFailedPrecondition);
  }
  return std::unique_ptr<PinnedHostMemory>(new PinnedHostMemory(ptr, device));
}

PinnedHostMemory::~PinnedHostMemory() {
  cudaSetDevice(device_);
  cudaHostUnregister(data_);
}

}  // namespace samplerd
