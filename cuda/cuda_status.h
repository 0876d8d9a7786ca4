// cudaError_t -> absl::Status, in one place for cuda/: the call named, the error's name and
// text; UNAVAILABLE for a missing or unusable device, INTERNAL otherwise.
//
//   SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(...));   // returns the Status on failure
#ifndef SAMPLERD_CUDA_CUDA_STATUS_H_
#define SAMPLERD_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace samplerd {

// `code` overrides the mapping where the caller knows better (e.g. FAILED_PRECONDITION for a
// client's handle that does not open; `what` then names the request field).
// `what` is a view: SAMPLERD_CUDA_RETURN passes the call's text on every CUDA call of a step,
// which must cost nothing when the call succeeds.
inline absl::Status CudaStatus(cudaError_t error, absl::string_view what,
                               absl::StatusCode code = absl::StatusCode::kOk) {
  if (error == cudaSuccess) return absl::OkStatus();
  if (code == absl::StatusCode::kOk) {
    code = (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver ||
            error == cudaErrorDevicesUnavailable)
               ? absl::StatusCode::kUnavailable
               : absl::StatusCode::kInternal;
  }
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                         cudaGetErrorString(error), ")"));
}

}  // namespace samplerd

#define SAMPLERD_CUDA_RETURN(call)                                \
  do {                                                            \
    const absl::Status _cuda_status = ::samplerd::CudaStatus((call), #call); \
    if (!_cuda_status.ok()) return _cuda_status;                  \
  } while (false)

#endif  // SAMPLERD_CUDA_CUDA_STATUS_H_
