#include "cuda/lane.h"

#include "cuda/cuda_status.h"

namespace samplerd {
namespace cuda {

absl::Status Lane::Init() {
  SAMPLERD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  SAMPLERD_CUDA_RETURN(cudaEventCreate(&start));
  SAMPLERD_CUDA_RETURN(cudaEventCreate(&stop));
  return absl::OkStatus();
}

void Lane::Destroy() {
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (stream != nullptr) cudaStreamDestroy(stream);
  start = stop = nullptr;
  stream = nullptr;
}

absl::Status Lane::Recover() {
  cudaError_t error = stream != nullptr ? cudaStreamSynchronize(stream) : cudaErrorInvalidValue;
  cudaGetLastError();
  if (error == cudaSuccess && split_arrival_slots > 0) {
    error = cudaMemsetAsync(split_arrivals_d.as<void>(), 0,
                            split_arrival_slots * sizeof(unsigned int), stream);
    if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  }
  if (error == cudaSuccess) {
    broken = false;
    return absl::OkStatus();
  }
  cudaGetLastError();
  Destroy();
  logits.Release();
  inputs_d.Release();
  workspace.Release();
  split_d.Release();
  split_arrivals_d.Release();
  split_arrival_slots = 0;
  staging.Release();
  absl::Status rebuilt = Init();
  broken = !rebuilt.ok();
  if (broken) Destroy();
  return rebuilt;
}

}  // namespace cuda
}  // namespace samplerd
