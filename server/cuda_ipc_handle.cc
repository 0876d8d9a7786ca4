#include "server/cuda_ipc_handle.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::StatusOr<CudaIpcHandle> ParseCudaIpcHandle(const std::string& bytes,
                                                 const std::string& field) {
  CudaIpcHandle handle;
  if (bytes.size() == kCudaIpcHandleBytes) {
    std::memcpy(handle.data(), bytes.data(), kCudaIpcHandleBytes);
    return handle;
  }
  if (bytes.size() == kCudaIpcHandleBytes + 2) {
    if (bytes[0] != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": a 66-byte handle must be PyTorch's _share_cuda_() form (version byte 2), "
                 "got version ", static_cast<int>(static_cast<unsigned char>(bytes[0]))));
    }
    if (bytes[1] == 'e') {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": the tensor lives in an expandable segment, which has no CUDA IPC handle; "
                 "disable expandable segments for the logits pool "
                 "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)"));
    }
    if (bytes[1] != 'c') {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown PyTorch handle type '", std::string(1, bytes[1]), "'"));
    }
    std::memcpy(handle.data(), bytes.data() + 2, kCudaIpcHandleBytes);
    return handle;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", bytes.size(), " bytes; a CUDA IPC handle is 64 bytes (cudaIpcMemHandle_t) "
      "or 66 (PyTorch's _share_cuda_())"));
}

}  // namespace samplerd
