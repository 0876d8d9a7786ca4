// Parsing of CUDA IPC memory handles as clients send them (no CUDA needed).
//
// Accepted: a raw 64-byte cudaIpcMemHandle_t, or PyTorch's _share_cuda_() handle: 66 bytes,
// version byte 2, type byte 'c', then the raw handle. Type 'e' (expandable segments) is
// refused: such memory has no single IPC handle.
//
//   ASSIGN_OR_RETURN(CudaIpcHandle handle, ParseCudaIpcHandle(bytes, "cuda_ipc_handle"));
#ifndef SAMPLERD_SERVER_CUDA_IPC_HANDLE_H_
#define SAMPLERD_SERVER_CUDA_IPC_HANDLE_H_

#include <array>
#include <string>

#include "absl/status/statusor.h"

namespace samplerd {

inline constexpr size_t kCudaIpcHandleBytes = 64;
using CudaIpcHandle = std::array<char, kCudaIpcHandleBytes>;

// Errors: INVALID_ARGUMENT naming `field` for any other length or form.
absl::StatusOr<CudaIpcHandle> ParseCudaIpcHandle(const std::string& bytes,
                                                 const std::string& field);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CUDA_IPC_HANDLE_H_
