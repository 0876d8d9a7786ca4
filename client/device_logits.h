// Logits in this process's GPU memory, shared with samplerd over CUDA IPC: what a model worker
// does with its logits pool, for `samplerctl bench --source=cuda_ipc`. A cudaMalloc copy of
// host bytes and its raw 64-byte cudaIpcMemHandle_t, registered as a CUDA_IPC region.
// Built with CUDA where the toolkit is present; without it, Create answers UNIMPLEMENTED.
//
//   ASSIGN_OR_RETURN(auto logits, DeviceLogits::Create(host.data(), bytes, /*device=*/0));
//   client.RegisterBuffer(logits->RegisterRequest("worker0-logits"));
#ifndef SAMPLERD_CLIENT_DEVICE_LOGITS_H_
#define SAMPLERD_CLIENT_DEVICE_LOGITS_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "samplerd/v1/sampler.pb.h"

namespace samplerd {

class DeviceLogits {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceLogits>> Create(const void* host, size_t bytes,
                                                              int device);
  ~DeviceLogits();
  DeviceLogits(const DeviceLogits&) = delete;
  DeviceLogits& operator=(const DeviceLogits&) = delete;

  // RegisterBuffer for the whole allocation as a CUDA_IPC region named `name`.
  v1::RegisterBufferRequest RegisterRequest(const std::string& name) const;

 private:
  DeviceLogits() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
  std::string handle_;  // cudaIpcMemHandle_t bytes
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_DEVICE_LOGITS_H_
