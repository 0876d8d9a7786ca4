// FlashInfer's sampling on the logits gpu_bench uses, for the kernels issue's "2x FlashInfer"
// comparison. Built by scripts/flashinfer_baseline.sh against the headers of the
// flashinfer-python wheel from PyPI (nothing of FlashInfer is in this repository); run on the
// GPU machine in the same call as gpu_bench, which reads the figures this writes and prints
// them beside its own.
//
// Paths timed (each returns a token per row only: no logprobs, no top logprobs, no per-request
// seed; FlashInfer keys its RNG by batch row):
//   topk_first   what flashinfer.top_k_top_p_sampling_from_logits runs for top_k = 50 on a
//                vocabulary >= 65,536 (its "top_k_first" fast path): TopKDispatch (radix top-k,
//                sorted, deterministic), a softmax over the k values with the temperature (the
//                Python path's torch.softmax; a small kernel here), TopPSamplingFromProb over
//                the k probabilities, and a gather of the token id (torch.gather there).
//   softmax_topp OnlineSoftmax with the temperature over the whole row, then
//                TopKTopPSamplingFromProb (the fused top-k/top-p rejection sampler).
//   clusters     topk_first with its top-k replaced by FlashInfer's thread-block-cluster exact
//                top-k (fast_topk_clusters_exact.cuh: a row's radix select over a cluster of
//                up to 8 blocks, with programmatic dependent launch), launched as
//                flashinfer.topk_clusters_exact launches it (clusters per row, cached entries
//                and overflow buffer by its rules); then the same softmax over the k values,
//                TopPSamplingFromProb and gather. (FlashInfer's Python dispatch uses it on
//                compute capability 10 only; it runs on 9.0, and Hopper is what we have.)
//   cake         FlashInfer's cluster sampler (csrc/cake_sampling: per-row thread-block
//                clusters, radix select through distributed shared memory, the top-p and the
//                draw fused into the same launch for k <= 64) as
//                flashinfer.cake_sampling.top_k_top_p_sampling_from_probs runs it, after the
//                softmax it needs in front (OnlineSoftmax with the temperature, fp32
//                probabilities: it serves float32 rows only). Its launch plan per batch size is
//                the one FlashInfer's own Python dispatcher picks for an H200
//                (bench/flashinfer_cake.py, built into cake_plans.h); its kernels and binding
//                are compiled from the wheel into a separate object (scripts/flashinfer_baseline.sh).
// Logits: gpu_bench's generator (sampler/test_util.h HostLogits: mt19937_64 seed 11, normal
// with scale 2.0), V = 129,280; bf16 rounded to nearest even as gpu_bench does.
//
//   flashinfer_baseline [FILE]   prints a table; FILE gets "path dtype R us" lines (per step)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "flashinfer/fast_topk_clusters_exact.cuh"
#include "flashinfer/sampling.cuh"
#include "flashinfer/topk.cuh"
#include "tvm/ffi/container/tensor.h"
#include "tvm/ffi/error.h"

#include "cuda/cuda_check.h"

// FlashInfer's cake_sampling binding (compiled from the wheel into its own object: the kernels'
// translation unit is 53 MB). RadixTopK is what top_k_top_p_sampling_from_probs calls when its
// plan is one launch, as every plan here is (checked below).
namespace flashinfer::cake_sampling {
using tvm::ffi::TensorView;
void RadixTopK(TensorView probs, TensorView topk_arr, int64_t topk_scalar, int64_t topk_kind,
               TensorView out_vals, TensorView out_idx, TensorView out_count, int64_t cluster,
               int64_t ept, int64_t stream_variant, TensorView topp_arr, double topp_scalar,
               int64_t topp_kind, TensorView out_samples, TensorView out_renorm, int64_t seed,
               int64_t offset, int64_t emit_renorm, int64_t launch_flags, int64_t cuda_stream);
}  // namespace flashinfer::cake_sampling

namespace {

// One row of FlashInfer's launch plan (flashinfer/cake_sampling.py's _LaunchPlan) for a batch.
struct CakePlan {
  uint32_t rows;
  int cluster, ept, stream, threads, items, launch_flags, one_launch, stage23_flags;
};
#include "cake_plans.h"

constexpr uint32_t kVocab = 129280;
constexpr int kTopK = 50;
constexpr float kTemperature = 0.7f, kTopP = 0.95f;

template <typename T>
__device__ float ToFloat(T v) { return static_cast<float>(v); }
template <>
__device__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// Softmax of each row's k selected logits at temperature T (one warp per row, k <= 64).
template <typename T>
__global__ void SoftmaxOfTopK(const T* values, float* probs, int k, float inv_t) {
  const int row = blockIdx.x, lane = threadIdx.x;
  const float a = lane < k ? ToFloat(values[row * k + lane]) * inv_t : -INFINITY;
  const float b = lane + 32 < k ? ToFloat(values[row * k + lane + 32]) * inv_t : -INFINITY;
  float m = fmaxf(a, b);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  const float ea = __expf(a - m), eb = __expf(b - m);
  float s = ea + eb;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  if (lane < k) probs[row * k + lane] = ea / s;
  if (lane + 32 < k) probs[row * k + lane + 32] = eb / s;
}

__global__ void GatherToken(const int32_t* indices, const int32_t* local, int32_t* out, int rows,
                            int k) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) out[r] = indices[r * k + local[r]];
}

// flashinfer.topk.get_fast_topk_clusters: clusters per row by batch size.
int ClustersFor(uint32_t rows) {
  if (kVocab < 8192) return 1;
  return rows <= 32 ? 8 : rows < 128 ? 4 : rows < 256 ? 2 : 1;
}

// flashinfer.topk.get_num_cached_for_topk: the entries a block caches in shared memory.
int NumCachedFor(int k) {
  int optin = 0;
  SAMPLERD_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const int blocks_per_sm = 65536 / (1024 * 32);
  const int shared_per_block = optin / blocks_per_sm;
  const int buffers_used = (k + 5 + 3 * 256 + 8) * 4;
  return (shared_per_block - buffers_used - 1024) / 16;
}

struct Run {
  std::string path, dtype;
  uint32_t rows;
  double us;      // one step at a time, as gpu_bench times samplerd (the figure compared)
  double b2b_us;  // steps queued back to back (launch gaps hidden), for reference
};

// A path's kernel time two ways. Per step, as samplerd's kernel_us is taken: an event, the
// step's launches, an event, wait; the median of 200 (20 at R = 8192) such steps. Back to back:
// the mean over as many steps queued between two events, where the host runs ahead and the
// gaps between one step's launches are hidden (how this bench timed until issue 34; it
// favours a path of several launches against samplerd's per-step figure).
template <typename Step>
std::pair<double, double> TimeUs(Step step, uint32_t rows, cudaStream_t stream) {
  for (int i = 0; i < 20; ++i) SAMPLERD_CUDA_CHECK(step(i));
  SAMPLERD_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  SAMPLERD_CUDA_CHECK(cudaEventCreate(&start));
  SAMPLERD_CUDA_CHECK(cudaEventCreate(&stop));
  const int iters = rows >= 4096 ? 20 : 200;
  std::vector<float> each(iters);
  for (int i = 0; i < iters; ++i) {
    SAMPLERD_CUDA_CHECK(cudaEventRecord(start, stream));
    SAMPLERD_CUDA_CHECK(step(100 + i));
    SAMPLERD_CUDA_CHECK(cudaEventRecord(stop, stream));
    SAMPLERD_CUDA_CHECK(cudaEventSynchronize(stop));
    SAMPLERD_CUDA_CHECK(cudaEventElapsedTime(&each[i], start, stop));
  }
  std::sort(each.begin(), each.end());
  SAMPLERD_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) SAMPLERD_CUDA_CHECK(step(1000 + i));
  SAMPLERD_CUDA_CHECK(cudaEventRecord(stop, stream));
  SAMPLERD_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  SAMPLERD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEvent_t events[2] = {start, stop};
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  return {each[iters / 2] * 1000.0, ms * 1000.0 / iters};
}

// The plans came from FlashInfer's dispatcher answered as an H200 (bench/flashinfer_cake.py).
bool CakePlansFitThisDevice() {
  cudaDeviceProp prop;
  SAMPLERD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return kCakeVocab == static_cast<int>(kVocab) && kCakeTopK == kTopK && prop.major == 9 &&
         prop.minor == 0 && prop.multiProcessorCount == 132 &&
         prop.sharedMemPerBlockOptin == 232448;
}

DLTensor CudaTensor(void* data, DLDataType type, int ndim, int64_t* shape, int64_t* strides) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCUDA, 0};
  t.ndim = ndim;
  t.dtype = type;
  t.shape = shape;
  t.strides = strides;
  return t;
}

// The cake path: OnlineSoftmax with the temperature into fp32 probabilities, then one
// RadixTopK launch with the plan's variant and flags, top_k and top_p scalars, no renormalized
// output (the arguments top_k_top_p_sampling_from_probs passes: the count buffer stands in for
// a scalar top_k's array, probs for a scalar top_p's, the slab values for renorm_out). Each
// sampled token is checked against the row's top-k set from TopKDispatch.
template <typename RadixTopK>
void RunCake(const CakePlan& plan, float* logits, float* probs, void* workspace,
             size_t workspace_bytes, int32_t* out, cudaStream_t stream, RadixTopK radix_top_k,
             const int32_t* topk_indices, std::vector<Run>* runs) {
  constexpr int64_t kSlab = 1024, kScalar = 1;  // manifest slab_entries; _TOPK/_TOPP_SCALAR
  const uint32_t rows = plan.rows;
  float* slab_vals;
  int32_t *slab_idx, *count;
  SAMPLERD_CUDA_CHECK(cudaMalloc(&slab_vals, size_t{rows} * kSlab * 4));
  SAMPLERD_CUDA_CHECK(cudaMalloc(&slab_idx, size_t{rows} * kSlab * 4));
  SAMPLERD_CUDA_CHECK(cudaMalloc(&count, size_t{rows} * 4));
  int64_t probs_shape[2] = {rows, kVocab}, probs_strides[2] = {kVocab, 1};
  int64_t slab_shape[2] = {rows, kSlab}, slab_strides[2] = {kSlab, 1};
  int64_t row_shape[1] = {rows}, row_strides[1] = {1};
  const DLDataType f32{kDLFloat, 32, 1}, i32{kDLInt, 32, 1};
  DLTensor probs_t = CudaTensor(probs, f32, 2, probs_shape, probs_strides);
  DLTensor vals_t = CudaTensor(slab_vals, f32, 2, slab_shape, slab_strides);
  DLTensor idx_t = CudaTensor(slab_idx, i32, 2, slab_shape, slab_strides);
  DLTensor count_t = CudaTensor(count, i32, 1, row_shape, row_strides);
  DLTensor out_t = CudaTensor(out, i32, 1, row_shape, row_strides);
  auto softmax = [&] {
    return flashinfer::sampling::OnlineSoftmax<float>(
        logits, probs, rows, kVocab, nullptr, kTemperature, workspace, workspace_bytes,
        /*enable_pdl=*/false, stream);
  };
  auto sample = [&](uint64_t offset) -> cudaError_t {
    try {
      flashinfer::cake_sampling::RadixTopK(
          &probs_t, &count_t, kTopK, kScalar, &vals_t, &idx_t, &count_t, plan.cluster, plan.ept,
          plan.stream, &probs_t, kTopP, kScalar, &out_t, &vals_t, /*seed=*/1234,
          static_cast<int64_t>(offset) * rows * 32, /*emit_renorm=*/0, plan.launch_flags,
          reinterpret_cast<int64_t>(stream));
    } catch (const tvm::ffi::Error& error) {
      std::fprintf(stderr, "cake: %s\n", error.what());
      return cudaErrorLaunchFailure;
    }
    return cudaGetLastError();
  };
  auto cake = [&](uint64_t offset) {
    const cudaError_t e = softmax();
    return e != cudaSuccess ? e : sample(offset);
  };
  const auto [us, b2b] = TimeUs(cake, rows, stream);
  runs->push_back({"cake", "fp32", rows, us, b2b});
  // Its sampling kernel alone, on probabilities already there: printed, not a path from logits
  // (so not in FILE, where gpu_bench takes the best path).
  const auto [alone_us, alone_b2b] = TimeUs(sample, rows, stream);
  std::printf("cake, R = %u: the sampling launch alone (probabilities given) %.1f us per step, "
              "%.1f back to back\n", rows, alone_us, alone_b2b);
  std::vector<int32_t> sampled(rows), topk(size_t{rows} * kTopK);
  SAMPLERD_CUDA_CHECK(cake(7));
  SAMPLERD_CUDA_CHECK(cudaStreamSynchronize(stream));
  SAMPLERD_CUDA_CHECK(cudaMemcpy(sampled.data(), out, rows * 4, cudaMemcpyDeviceToHost));
  SAMPLERD_CUDA_CHECK(radix_top_k());
  SAMPLERD_CUDA_CHECK(cudaStreamSynchronize(stream));
  SAMPLERD_CUDA_CHECK(cudaMemcpy(topk.data(), topk_indices, topk.size() * 4,
                                 cudaMemcpyDeviceToHost));
  size_t outside = 0;
  for (uint32_t r = 0; r < rows; ++r) {
    outside += std::find(topk.begin() + r * kTopK, topk.begin() + (r + 1) * kTopK,
                         sampled[r]) == topk.begin() + (r + 1) * kTopK;
  }
  std::printf("cake, R = %u (cluster %d, %d a thread, %s, flags %d): %zu sampled tokens outside "
              "TopKDispatch's top-k set\n", rows, plan.cluster, plan.ept,
              plan.stream ? "streaming" : "resident", plan.launch_flags, outside);
  for (void* ptr : {static_cast<void*>(slab_vals), static_cast<void*>(slab_idx),
                    static_cast<void*>(count)}) {
    cudaFree(ptr);
  }
}

template <typename T>
void RunDType(const char* dtype, const std::vector<float>& all, std::vector<Run>* runs) {
  for (uint32_t rows : {1u, 16u, 384u, 8192u}) {
    const size_t n = static_cast<size_t>(rows) * kVocab;
    std::vector<T> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<T>(all[i]);
    T *logits, *values;
    float *probs, *probs_k;
    int32_t *out, *indices, *local;
    bool* valid;
    void *workspace, *row_states;
    const size_t workspace_bytes = size_t{256} << 20, row_states_bytes = size_t{1} << 20;
    SAMPLERD_CUDA_CHECK(cudaMalloc(&logits, n * sizeof(T)));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&probs, n * 4));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&values, size_t{rows} * kTopK * sizeof(T)));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&probs_k, size_t{rows} * kTopK * 4));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&indices, size_t{rows} * kTopK * 4));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&local, rows * 4));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&out, rows * 4));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&valid, rows));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    SAMPLERD_CUDA_CHECK(cudaMalloc(&row_states, row_states_bytes));
    SAMPLERD_CUDA_CHECK(cudaMemset(row_states, 0, row_states_bytes));  // as flashinfer's _get_row_states_buffer
    SAMPLERD_CUDA_CHECK(cudaMemcpy(logits, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    cudaStream_t stream;
    SAMPLERD_CUDA_CHECK(cudaStreamCreate(&stream));
    // After a top-k (values, indices): the softmax over the k values at the temperature,
    // top-p sampling over those probabilities, and the token id (both top-k paths).
    auto sample_top_k = [&](uint64_t offset) {
      SoftmaxOfTopK<T><<<rows, 32, 0, stream>>>(values, probs_k, kTopK, 1.0f / kTemperature);
      const cudaError_t e = flashinfer::sampling::TopPSamplingFromProb<float, int32_t>(
          probs_k, local, valid, nullptr, nullptr, rows, kTopP, kTopK, /*deterministic=*/true,
          nullptr, /*seed_val=*/1234, nullptr, offset, stream);
      if (e != cudaSuccess) return e;
      GatherToken<<<(rows + 255) / 256, 256, 0, stream>>>(indices, local, out, rows, kTopK);
      return cudaGetLastError();
    };
    // FlashInfer's radix top-k (sorted, deterministic) into values and indices.
    auto radix_top_k = [&] {
      return flashinfer::sampling::TopKDispatch<T, int32_t>(
          logits, indices, values, rows, kTopK, kVocab,
          static_cast<flashinfer::sampling::RadixRowState*>(row_states), /*sorted_output=*/true,
          /*deterministic=*/true, flashinfer::sampling::TopKTieBreak::None, stream);
    };
    auto topk_first = [&](uint64_t offset) {
      const cudaError_t e = radix_top_k();
      return e != cudaSuccess ? e : sample_top_k(offset);
    };
    {
      const auto [us, b2b] = TimeUs(topk_first, rows, stream);
      runs->push_back({"topk_first", dtype, rows, us, b2b});
    }
    if constexpr (sizeof(T) == 4) {  // FlashInfer's binding takes fp32 and fp16 only
      const int clusters = ClustersFor(rows), num_cached = NumCachedFor(kTopK);
      const int overflow_per_cluster = static_cast<int>(kVocab) / clusters;
      int* overflow;
      SAMPLERD_CUDA_CHECK(cudaMalloc(&overflow, size_t{rows} * 4 * overflow_per_cluster *
                                                    clusters * sizeof(int)));
      auto cluster_topk = [&](uint64_t offset) {
        flashinfer::sampling::launch_fast_topk_clusters_exact<T, int32_t>(
            logits, indices, values, static_cast<int>(kVocab), /*pre_hist=*/nullptr, overflow,
            overflow_per_cluster, static_cast<int>(rows), static_cast<int>(kVocab), kTopK,
            num_cached, clusters, /*pdl_enabled=*/true, kTopK, stream);
        const cudaError_t e = cudaGetLastError();
        return e != cudaSuccess ? e : sample_top_k(offset);
      };
      {
        const auto [us, b2b] = TimeUs(cluster_topk, rows, stream);
        runs->push_back({"clusters", dtype, rows, us, b2b});
      }
      // The top-k it found against TopKDispatch's (as sets: the cluster kernel's order is its
      // own), so a wrong launch cannot pass for a fast one.
      std::vector<int32_t> a(size_t{rows} * kTopK), b(a.size());
      SAMPLERD_CUDA_CHECK(cudaStreamSynchronize(stream));
      SAMPLERD_CUDA_CHECK(cudaMemcpy(a.data(), indices, a.size() * 4, cudaMemcpyDeviceToHost));
      SAMPLERD_CUDA_CHECK(radix_top_k());
      SAMPLERD_CUDA_CHECK(cudaStreamSynchronize(stream));
      SAMPLERD_CUDA_CHECK(cudaMemcpy(b.data(), indices, b.size() * 4, cudaMemcpyDeviceToHost));
      size_t differ = 0;
      for (uint32_t r = 0; r < rows; ++r) {
        std::sort(a.begin() + r * kTopK, a.begin() + (r + 1) * kTopK);
        std::sort(b.begin() + r * kTopK, b.begin() + (r + 1) * kTopK);
        differ += !std::equal(a.begin() + r * kTopK, a.begin() + (r + 1) * kTopK,
                              b.begin() + r * kTopK);
      }
      std::printf("clusters top-k, R = %u (%d clusters a row, %d cached): %zu rows differ from "
                  "TopKDispatch's set\n", rows, clusters, num_cached, differ);
      cudaFree(overflow);
    }
    if constexpr (sizeof(T) == 4) {
      auto softmax_topp = [&](uint64_t offset) {
        cudaError_t e = flashinfer::sampling::OnlineSoftmax<float>(
            logits, probs, rows, kVocab, nullptr, kTemperature, workspace, workspace_bytes,
            /*enable_pdl=*/false, stream);
        if (e != cudaSuccess) return e;
        return flashinfer::sampling::TopKTopPSamplingFromProb<float, int32_t>(
            probs, nullptr, nullptr, out, valid, nullptr, rows, kTopK, kTopP, kVocab,
            /*deterministic=*/true, nullptr, /*seed_val=*/1234, nullptr, offset, stream);
      };
      const auto [us, b2b] = TimeUs(softmax_topp, rows, stream);
      runs->push_back({"softmax_topp", dtype, rows, us, b2b});
    }
    if constexpr (sizeof(T) == 4) {
      const CakePlan* plan = nullptr;
      for (const CakePlan& p : kCakePlans) plan = p.rows == rows ? &p : plan;
      if (plan == nullptr || plan->one_launch != 1 || !CakePlansFitThisDevice()) {
        std::printf("cake, R = %u: skipped (no one-launch H200 plan for this batch and device)\n",
                    rows);
      } else {
        RunCake(*plan, logits, probs, workspace, workspace_bytes, out, stream, radix_top_k,
                indices, runs);
      }
    }
    for (void* ptr : {static_cast<void*>(logits), static_cast<void*>(probs),
                      static_cast<void*>(values), static_cast<void*>(probs_k),
                      static_cast<void*>(indices), static_cast<void*>(local),
                      static_cast<void*>(out), static_cast<void*>(valid), workspace, row_states}) {
      cudaFree(ptr);
    }
    cudaStreamDestroy(stream);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("flashinfer (flashinfer-python wheel headers), V = %u, T = %.1f, top_k %d, "
              "top_p %.2f\n", kVocab, kTemperature, kTopK, kTopP);
  // gpu_bench's logits: the largest configuration's rows; smaller ones take its first rows.
  std::vector<float> all(size_t{8192} * kVocab);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& v : all) v = normal(rng);
  std::vector<Run> runs;
  RunDType<float>("fp32", all, &runs);
  RunDType<__nv_bfloat16>("bf16", all, &runs);
  std::printf("%-14s %-6s %6s %14s %18s\n", "path", "dtype", "R", "per-step us",
              "back-to-back us");
  for (const Run& r : runs) {
    std::printf("%-14s %-6s %6u %14.1f %18.1f\n", r.path.c_str(), r.dtype.c_str(), r.rows, r.us,
                r.b2b_us);
  }
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr) {
      std::perror(argv[1]);
      return 1;
    }
    for (const Run& r : runs) std::fprintf(f, "%s %s %u %.2f\n", r.path.c_str(), r.dtype.c_str(), r.rows, r.us);
    std::fclose(f);
  }
  return 0;
}
