// DeviceLogits in a build without the CUDA toolkit: there is no GPU memory to share.
#include "client/device_logits.h"

namespace samplerd {

absl::StatusOr<std::unique_ptr<DeviceLogits>> DeviceLogits::Create(const void*, size_t, int) {
  return absl::UnimplementedError(
      "this samplerctl was built without CUDA: --source=cuda_ipc needs a build with the CUDA "
      "toolkit (DESIGN.md, the GPU machine)");
}

DeviceLogits::~DeviceLogits() = default;

v1::RegisterBufferRequest DeviceLogits::RegisterRequest(const std::string& name) const {
  v1::RegisterBufferRequest request;
  request.set_name(name);
  return request;
}

absl::StatusOr<std::unique_ptr<DeviceTokens>> DeviceTokens::Create(int, int, int) {
  return absl::UnimplementedError(
      "this samplerctl was built without CUDA: device tokens need a build with the CUDA toolkit");
}
DeviceTokens::~DeviceTokens() = default;
v1::RegisterBufferRequest DeviceTokens::RegisterRequest(const std::string&) const { return {}; }
v1::StepOutput DeviceTokens::Next(const std::string&, int) { return {}; }
absl::Status DeviceTokens::Wait(void*) const {
  return absl::UnimplementedError("built without CUDA");
}
absl::Status DeviceTokens::Read(std::vector<int32_t>*, std::vector<int32_t>*) const {
  return absl::UnimplementedError("built without CUDA");
}

}  // namespace samplerd
