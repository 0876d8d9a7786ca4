// DeviceLogits with the CUDA runtime (the build found a toolkit).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "client/device_logits.h"
#include "cuda/cuda_status.h"

namespace samplerd {

absl::StatusOr<std::unique_ptr<DeviceLogits>> DeviceLogits::Create(const void* host, size_t bytes,
                                                                   int device) {
  auto fail = [](const char* what, cudaError_t e) { return CudaStatus(e, what); };
  std::unique_ptr<DeviceLogits> out(new DeviceLogits());
  out->bytes_ = bytes;
  out->device_ = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return fail("cudaSetDevice", e);
  if (cudaError_t e = cudaMalloc(&out->data_, bytes); e != cudaSuccess) return fail("cudaMalloc", e);
  if (cudaError_t e = cudaMemcpy(out->data_, host, bytes, cudaMemcpyHostToDevice); e != cudaSuccess) {
    return fail("cudaMemcpy", e);
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, out->data_); e != cudaSuccess) {
    return fail("cudaIpcGetMemHandle", e);
  }
  out->handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return out;
}

DeviceLogits::~DeviceLogits() {
  if (data_ != nullptr) cudaFree(data_);
}

v1::RegisterBufferRequest DeviceLogits::RegisterRequest(const std::string& name) const {
  v1::RegisterBufferRequest request;
  request.set_name(name);
  request.set_kind(v1::CUDA_IPC);
  request.set_cuda_ipc_handle(handle_);
  request.set_device_id(device_);
  request.set_byte_size(static_cast<int64_t>(bytes_));
  return request;
}

}  // namespace samplerd
