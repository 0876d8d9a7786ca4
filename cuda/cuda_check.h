// Benchmarks, tools and test workers only: a CUDA call that must succeed, or the process
// prints the call and CUDA's error and exits 1. Production code returns absl::Status instead
// (cuda_status.h's SAMPLERD_CUDA_RETURN). Header-only, so nvcc-built tools include it too.
//
//   SAMPLERD_CUDA_CHECK(cudaMalloc(&ptr, bytes));
#ifndef SAMPLERD_CUDA_CUDA_CHECK_H_
#define SAMPLERD_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define SAMPLERD_CUDA_CHECK(call)                                               \
  do {                                                                          \
    const cudaError_t samplerd_cuda_check_error = (call);                       \
    if (samplerd_cuda_check_error != cudaSuccess) {                             \
      std::fprintf(stderr, "%s: %s\n", #call,                                   \
                   cudaGetErrorString(samplerd_cuda_check_error));              \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

#endif  // SAMPLERD_CUDA_CUDA_CHECK_H_
