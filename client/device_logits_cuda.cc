// DeviceLogits with the CUDA runtime (the build found a toolkit).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "client/device_logits.h"
#include "cuda/cuda_status.h"

namespace samplerd {
namespace {

// `bytes` of device memory on `device` into *data (freed by the owner's destructor, also on
// a later error), set from `host` (null: zeros), and its CUDA IPC handle's bytes.
absl::Status AllocShared(int device, size_t bytes, const void* host, void** data,
                         std::string* handle) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaStatus(e, "cudaSetDevice");
  if (cudaError_t e = cudaMalloc(data, bytes); e != cudaSuccess) return CudaStatus(e, "cudaMalloc");
  const cudaError_t set = host != nullptr
                              ? cudaMemcpy(*data, host, bytes, cudaMemcpyHostToDevice)
                              : cudaMemset(*data, 0, bytes);
  if (set != cudaSuccess) return CudaStatus(set, host != nullptr ? "cudaMemcpy" : "cudaMemset");
  cudaIpcMemHandle_t ipc;
  if (cudaError_t e = cudaIpcGetMemHandle(&ipc, *data); e != cudaSuccess) {
    return CudaStatus(e, "cudaIpcGetMemHandle");
  }
  handle->assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
  return absl::OkStatus();
}

// The RegisterBuffer request of such an allocation.
v1::RegisterBufferRequest Registration(const std::string& name, const std::string& handle,
                                       int device, int64_t bytes, bool output) {
  v1::RegisterBufferRequest request;
  request.set_name(name);
  request.set_kind(v1::CUDA_IPC);
  request.set_cuda_ipc_handle(handle);
  request.set_device_id(device);
  request.set_byte_size(bytes);
  request.set_output(output);
  return request;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceLogits>> DeviceLogits::Create(const void* host, size_t bytes,
                                                                   int device) {
  std::unique_ptr<DeviceLogits> out(new DeviceLogits());
  out->bytes_ = bytes;
  out->device_ = device;
  if (absl::Status s = AllocShared(device, bytes, host, &out->data_, &out->handle_); !s.ok()) {
    return s;
  }
  return out;
}

DeviceLogits::~DeviceLogits() {
  if (data_ != nullptr) cudaFree(data_);
}

v1::RegisterBufferRequest DeviceLogits::RegisterRequest(const std::string& name) const {
  return Registration(name, handle_, device_, static_cast<int64_t>(bytes_), /*output=*/false);
}

absl::StatusOr<std::unique_ptr<DeviceTokens>> DeviceTokens::Create(int max_requests,
                                                                   int tokens_per_request,
                                                                   int device) {
  if (max_requests < 1 || tokens_per_request < 1 || max_requests > (1 << 20) ||
      tokens_per_request > (1 << 10)) {
    return absl::InvalidArgumentError("DeviceTokens: 1..2^20 requests of 1..1024 tokens");
  }
  std::unique_ptr<DeviceTokens> out(new DeviceTokens());
  out->max_requests_ = max_requests;
  out->tokens_per_request_ = tokens_per_request;
  out->device_ = device;
  const int64_t words = int64_t{max_requests} * (tokens_per_request + 1);
  out->done_offset_ = (words * 4 + 127) / 128 * 128;  // the done word in a line of its own
  out->bytes_ = out->done_offset_ + 128;
  if (absl::Status s = AllocShared(device, static_cast<size_t>(out->bytes_), /*host=*/nullptr,
                                   &out->data_, &out->handle_);
      !s.ok()) {
    return s;
  }
  return out;
}

DeviceTokens::~DeviceTokens() {
  if (data_ != nullptr) cudaFree(data_);
}

v1::RegisterBufferRequest DeviceTokens::RegisterRequest(const std::string& name) const {
  return Registration(name, handle_, device_, bytes_, /*output=*/true);
}

v1::StepOutput DeviceTokens::Next(const std::string& name, int num_requests) {
  value_ = value_ + 1 == 0 ? 1 : value_ + 1;
  v1::StepOutput output;
  output.mutable_token_ids()->set_name(name);
  output.set_tokens_per_request(tokens_per_request_);
  output.mutable_num_accepted()->set_name(name);
  output.mutable_num_accepted()->set_byte_offset(int64_t{4} * max_requests_ * tokens_per_request_);
  output.mutable_done_word()->set_name(name);
  output.mutable_done_word()->set_byte_offset(done_offset_);
  output.set_done_value(value_);
  (void)num_requests;  // the server checks the slices against the step's requests
  return output;
}

absl::Status DeviceTokens::Wait(void* stream) const {
  // The driver's cuStreamWaitValue32, through the runtime (no link against libcuda).
  using WaitValue = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  static WaitValue wait = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault,
                                         &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<WaitValue>(fn);
  }();
  if (wait == nullptr) return absl::UnavailableError("this CUDA driver has no cuStreamWaitValue32");
  const CUresult r = wait(static_cast<CUstream>(stream),
                          reinterpret_cast<CUdeviceptr>(static_cast<char*>(data_) + done_offset_),
                          value_, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuStreamWaitValue32 failed: CUresult ", r));
  }
  return absl::OkStatus();
}

absl::Status DeviceTokens::Read(std::vector<int32_t>* token_ids,
                                std::vector<int32_t>* num_accepted) const {
  const size_t tokens = static_cast<size_t>(max_requests_) * tokens_per_request_;
  std::vector<int32_t> all(tokens + max_requests_);
  if (cudaError_t e = cudaMemcpy(all.data(), data_, all.size() * 4, cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    return CudaStatus(e, "cudaMemcpy");
  }
  token_ids->assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(tokens));
  num_accepted->assign(all.begin() + static_cast<std::ptrdiff_t>(tokens), all.end());
  return absl::OkStatus();
}

}  // namespace samplerd
