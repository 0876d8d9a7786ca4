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

}  // namespace samplerd
