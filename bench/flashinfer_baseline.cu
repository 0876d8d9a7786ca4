// FlashInfer's sampling on the logits gpu_bench uses, for the kernels issue's "2x FlashInfer"
// comparison. Built by scripts/flashinfer_baseline.sh against the headers of the
// flashinfer-python wheel from PyPI (nothing of FlashInfer is in this repository); run on the
// GPU machine in the same call as gpu_bench.
//
// Path timed: OnlineSoftmax with the temperature (logits -> probabilities), then
// TopKTopPSamplingFromProb (top_k 50, top_p 0.95): FlashInfer's fused top-k/top-p rejection
// sampler. It returns a token per row only: no logprobs, no top logprobs, no per-request seed.
// Logits: the same generator as gpu_bench (normal * 2.5, fixed seed), V = 129,280, fp32.
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <vector>

#include "flashinfer/sampling.cuh"

#define CHECK(call)                                                                \
  do {                                                                             \
    cudaError_t e = (call);                                                        \
    if (e != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e));              \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

int main() {
  constexpr uint32_t kVocab = 129280;
  const float temperature = 0.7f, top_p = 0.95f;
  const int top_k = 50;
  std::printf("flashinfer (wheel headers): OnlineSoftmax + TopKTopPSamplingFromProb, V = %u fp32, "
              "T = %.1f, top_k %d, top_p %.2f\n", kVocab, temperature, top_k, top_p);
  std::printf("%-8s %12s\n", "R", "kernel us");
  for (uint32_t rows : {1u, 16u, 384u, 4096u}) {
    const size_t n = static_cast<size_t>(rows) * kVocab;
    std::vector<float> host(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 2.5f);
    for (float& x : host) x = normal(rng);
    float *logits, *probs;
    int32_t* out;
    bool* valid;
    void* workspace;
    const size_t workspace_bytes = size_t{256} << 20;
    CHECK(cudaMalloc(&logits, n * 4));
    CHECK(cudaMalloc(&probs, n * 4));
    CHECK(cudaMalloc(&out, rows * 4));
    CHECK(cudaMalloc(&valid, rows));
    CHECK(cudaMalloc(&workspace, workspace_bytes));
    CHECK(cudaMemcpy(logits, host.data(), n * 4, cudaMemcpyHostToDevice));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    auto step = [&](uint64_t offset) {
      cudaError_t e = flashinfer::sampling::OnlineSoftmax<float>(
          logits, probs, rows, kVocab, nullptr, temperature, workspace, workspace_bytes,
          /*enable_pdl=*/false, stream);
      if (e != cudaSuccess) return e;
      return flashinfer::sampling::TopKTopPSamplingFromProb<float, int32_t>(
          probs, nullptr, nullptr, out, valid, nullptr, rows, top_k, top_p, kVocab,
          /*deterministic=*/true, nullptr, /*seed_val=*/1234, nullptr, offset, stream);
    };
    for (int i = 0; i < 20; ++i) CHECK(step(i));
    CHECK(cudaStreamSynchronize(stream));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    const int iters = rows >= 4096 ? 20 : 200;
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) CHECK(step(100 + i));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("%-8u %12.1f\n", rows, ms * 1000.0f / iters);
    cudaFree(logits);
    cudaFree(probs);
    cudaFree(out);
    cudaFree(valid);
    cudaFree(workspace);
    cudaStreamDestroy(stream);
  }
  return 0;
}
