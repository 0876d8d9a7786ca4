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
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// Where samplerd writes a step's tokens in this process's GPU memory (StepOutput, issue 46): one
// cudaMalloc'd area of token ids [max_requests][tokens_per_request], accept counts
// [max_requests] and a done word, registered for output. A worker's next forward reads
// token_ids() after Wait() on its stream; no token crosses to the device from the host.
//
//   ASSIGN_OR_RETURN(auto tokens, DeviceTokens::Create(64, 1, /*device=*/0));
//   RETURN_IF_ERROR(client.RegisterBuffer(tokens->RegisterRequest("worker0-tokens")));
//   *request.mutable_output() = tokens->Next("worker0-tokens", 64);   // each step
//   RETURN_IF_ERROR(tokens->Wait(stream));  // the stream waits on the device
class DeviceTokens {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceTokens>> Create(int max_requests,
                                                              int tokens_per_request, int device);
  ~DeviceTokens();
  DeviceTokens(const DeviceTokens&) = delete;
  DeviceTokens& operator=(const DeviceTokens&) = delete;

  // RegisterBuffer for the area, registered for output.
  v1::RegisterBufferRequest RegisterRequest(const std::string& name) const;
  // The next step's StepOutput into region `name`: its done value counts the steps.
  v1::StepOutput Next(const std::string& name, int num_requests);
  // Makes `stream` (a cudaStream_t) wait on the device until samplerd wrote the tokens of the
  // step Next() last described (cuStreamWaitValue32, GEQ): valid before samplerd has even
  // received the step.
  absl::Status Wait(void* stream) const;
  // Copies the area back (tests and checks; synchronous): token ids, then accept counts.
  absl::Status Read(std::vector<int32_t>* token_ids, std::vector<int32_t>* num_accepted) const;
  uint32_t done_value() const { return value_; }

 private:
  DeviceTokens() = default;
  void* data_ = nullptr;
  int max_requests_ = 0;
  int tokens_per_request_ = 0;
  int64_t done_offset_ = 0;  // bytes
  int64_t bytes_ = 0;
  int device_ = 0;
  uint32_t value_ = 0;
  std::string handle_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_DEVICE_LOGITS_H_
