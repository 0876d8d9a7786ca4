// SPEC 7's RAW logprobs on the fast paths: after the split and fused paths have sampled a step
// (with processed logprobs), one cluster of blocks per RAW row reads the row as sent once into
// shared memory and overwrites the row's reported logprobs (token, top, prompt) with raw ones.
#include <cfloat>
#include <cmath>

#include <cooperative_groups.h>

#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/row_prologue.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// Distances below the raw max (nats) at which the cluster counts finite tokens: the smallest
// band that holds the row's top_logprobs largest raw logits is gathered whole, when it fits
// the candidate list (the common case: a row's few largest logits lie within a few nats of the
// max). The last band admits every finite token.
constexpr int kRawBands = 12;
__constant__ float kRawBandNats[kRawBands] = {0.25f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f,
                                              4.0f,  6.0f, 8.0f, 12.0f, 20.0f, FLT_MAX};

struct RawShared {
  int cand_id[kCandidateCapacity];
  uint32_t cand_key[kCandidateCapacity];  // OrderKey of the raw logit
  unsigned int hist[256];
  unsigned int band_count[kRawBands];
  unsigned int digit_total[256];
  double scratch_d[32];
  float scratch_f[32];
  int scratch_i[32];
  unsigned int scratch_u[32];
  int count;
  unsigned int ties;  // this block's entries equal to the selected key (radix case)
  int digit;
  unsigned int rest;
};

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kClusterThreads, 2)
    RawLogprobsKernel(StepParams p, int chunk) {
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int j = p.raw_jobs[blockIdx.x / kClusterBlocks];
  RowResult& out = p.results[j];
  // A failed row reports nothing: the path's status stands. Written by the path's launch, before
  // this one on the stream: the same value in every block of the cluster.
  if (out.status != 0) return;
  extern __shared__ float xs[];
  __shared__ RawShared sh;
  const RowJob job = p.jobs[j];
  const bool prompt = job.kind == kRowPrompt;
  const int V = p.vocab_size;
  const int lo = rank * chunk;
  const int n = max(0, min(V, lo + chunk) - lo);

  // The row as sent: no mask, no updates (SPEC 7). NaN and +inf have already failed the row.
  RowJob as_sent = job;
  as_sent.mask = nullptr;
  as_sent.update_end = as_sent.update_begin;
  int bad = 0;
  float m = kNegInf, mn = INFINITY;
  LoadChunk(p, as_sent, lo, n, xs, &bad, &m, &mn);
  double raw_max[1] = {BlockReduce(m, MaxOp(), sh.scratch_f)};
  ClusterCombine(cluster, raw_max, MaxOp());
  const float M = static_cast<float>(raw_max[0]);
  const int want = prompt ? 0 : job.top_logprobs;
  auto pad_from = [&](int first) {
    for (int i = first + static_cast<int>(threadIdx.x); i < want; i += blockDim.x) {
      out.top_ids[i] = -1;
      out.top_logprobs[i] = kNegInf;
    }
  };
  if (M == kNegInf) {  // no finite raw logit (not reachable with a sampled token; kept for safety)
    if (rank == 0) {
      if (threadIdx.x == 0) (prompt ? out.prompt_logprob : out.logprob) = kNegInf;
      pad_from(0);
    }
    return;
  }
  // exp(v - M) summed in float64 (as the general algorithm does), and the band counts.
  if (threadIdx.x < kRawBands) sh.band_count[threadIdx.x] = 0;
  __syncthreads();
  double z = 0.0;
  unsigned int counts[kRawBands];
#pragma unroll
  for (int b = 0; b < kRawBands; ++b) counts[b] = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xs[i];
    if (v == kNegInf) continue;
    z += expf(v - M);
    const float d = M - v;
#pragma unroll
    for (int b = 0; b < kRawBands - 1; ++b) counts[b] += d <= kRawBandNats[b];
    counts[kRawBands - 1] += 1;
  }
#pragma unroll
  for (int b = 0; b < kRawBands; ++b) {
    const unsigned int warp_sum = __reduce_add_sync(0xFFFFFFFFu, counts[b]);
    if ((threadIdx.x & 31) == 0 && warp_sum > 0) atomicAdd(&sh.band_count[b], warp_sum);
  }
  double sums[1 + kRawBands];
  sums[0] = BlockReduce(z, SumOp(), sh.scratch_d);  // its barriers also publish band_count
#pragma unroll
  for (int b = 0; b < kRawBands; ++b) sums[1 + b] = sh.band_count[b];
  ClusterCombine(cluster, sums, SumOp());
  const double log_z = log(sums[0]);
  auto raw_lp = [&](float v) {
    return static_cast<float>(static_cast<double>(v) - static_cast<double>(M) - log_z);
  };
  auto raw_lp_at = [&](int t) {
    return t < 0 || t >= V ? kNegInf : raw_lp(LoadLogitAt(p, job.logits_row, t));
  };
  if (rank == 0 && threadIdx.x == 0) {
    if (prompt) {
      out.prompt_logprob = raw_lp_at(job.target);
    } else {
      out.logprob = raw_lp_at(out.token);
    }
  }
  const int finite = static_cast<int>(sums[kRawBands]);
  const int need = min(want, finite);
  if (need == 0) {
    if (rank == 0) pad_from(0);
    return;
  }
  int band = 0;
  while (static_cast<int>(sums[1 + band]) < need) ++band;  // the last band holds every finite
  const float reach = kRawBandNats[band];
  const bool everything = band == kRawBands - 1;
  auto in_band = [&](float v) { return v != kNegInf && (everything || M - v <= reach); };

  if (threadIdx.x == 0) sh.count = 0;
  __syncthreads();
  auto append = [&](int i, uint32_t key) {
    const int slot = atomicAdd(&sh.count, 1);
    sh.cand_id[slot] = lo + i;
    sh.cand_key[slot] = key;
  };
  if (static_cast<int>(sums[1 + band]) <= kCandidateCapacity) {
    // The band holds the top `need` (every tie of the need-th value included): gather it whole.
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xs[i];
      if (in_band(v)) append(i, OrderKey(v));
    }
  } else {
    // Too many in the band (a flat row, or a wide gap above a dense band): the need-th largest
    // key by a radix selection over the cluster (8-bit digits, each block's histogram of its
    // chunk, summed over the blocks), then the keys above it and the first ties in id order.
    uint32_t prefix = 0, prefix_mask = 0;
    unsigned int rest = static_cast<unsigned int>(need - 1);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.hist[b] = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xs[i];
        if (!in_band(v)) continue;
        const uint32_t k = OrderKey(v);
        if ((k & prefix_mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 255u], 1u);
      }
      cluster.sync();
      for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        unsigned int t = 0;
        for (int r = 0; r < kClusterBlocks; ++r) t += cluster.map_shared_rank(sh.hist, r)[b];
        sh.digit_total[b] = t;
      }
      cluster.sync();  // every block has read the histograms before the next round clears them
      if (threadIdx.x == 0) {
        unsigned int before = 0;
        int digit = 0;
        for (int d = 255; d >= 0; --d) {
          if (before + sh.digit_total[d] > rest) {
            digit = d;
            break;
          }
          before += sh.digit_total[d];
        }
        sh.digit = digit;
        sh.rest = rest - before;
      }
      __syncthreads();
      prefix |= static_cast<uint32_t>(sh.digit) << shift;
      prefix_mask |= 255u << shift;
      rest = sh.rest;
      __syncthreads();
    }
    // Keys above the selected one; of the keys equal to it, the first rest + 1 in id order (the
    // blocks' chunks are in id order: the ties of lower ranks come first).
    if (threadIdx.x == 0) sh.ties = 0;
    __syncthreads();
    unsigned int ties = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xs[i];
      if (!in_band(v)) continue;
      const uint32_t k = OrderKey(v);
      if (k > prefix) append(i, k);
      ties += k == prefix;
    }
    ties = __reduce_add_sync(0xFFFFFFFFu, ties);
    if ((threadIdx.x & 31) == 0 && ties > 0) atomicAdd(&sh.ties, ties);
    cluster.sync();
    unsigned int running = 0;
    for (int r = 0; r < rank; ++r) running += cluster.map_shared_rank(&sh, r)->ties;
    for (int tile = 0; tile < n && running <= rest; tile += blockDim.x) {
      const int i = tile + static_cast<int>(threadIdx.x);
      unsigned int tie = 0;
      if (i < n && in_band(xs[i])) tie = OrderKey(xs[i]) == prefix;
      unsigned int total;
      const unsigned int before = running + BlockExclusiveScan(tie, &total, sh.scratch_u);
      if (tie && before <= rest) append(i, prefix);
      running += total;
      __syncthreads();
    }
  }
  cluster.sync();  // every block's list is complete
  // Block 0 ranks the union (descending key, ties by lower id) and writes the first `need`.
  if (rank == 0) {
    __shared__ int offsets[kClusterBlocks + 1];
    if (threadIdx.x == 0) {
      offsets[0] = 0;
      for (int r = 0; r < kClusterBlocks; ++r) {
        offsets[r + 1] = offsets[r] + cluster.map_shared_rank(&sh, r)->count;
      }
    }
    __syncthreads();
    const int total = offsets[kClusterBlocks];
    for (int i = offsets[1] + static_cast<int>(threadIdx.x); i < total; i += blockDim.x) {
      int r = 1;
      while (offsets[r + 1] <= i) ++r;
      const RawShared* remote = cluster.map_shared_rank(&sh, r);
      sh.cand_id[i] = remote->cand_id[i - offsets[r]];
      sh.cand_key[i] = remote->cand_key[i - offsets[r]];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      const uint32_t key = sh.cand_key[i];
      const int id = sh.cand_id[i];
      int place = 0;
      for (int k = 0; k < total; ++k) {
        const uint32_t other = sh.cand_key[k];
        place += other > key || (other == key && sh.cand_id[k] < id);
      }
      if (place < need) {
        out.top_ids[place] = id;
        out.top_logprobs[place] = raw_lp(FromOrderKey(key));
      }
    }
    pad_from(need);
  }
  cluster.sync();  // the other blocks' lists stay alive until block 0 has copied them
}

}  // namespace detail

LaunchConfig RawRowsConfig(const StepParams& params) {
  const size_t smem = static_cast<size_t>(FusedChunk(params.vocab_size)) * sizeof(float);
  return LaunchConfig{"RawLogprobsKernel", dim3(params.num_raw * detail::kClusterBlocks),
                      dim3(detail::kClusterThreads), smem};
}

cudaError_t LaunchRawRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_raw == 0) return cudaSuccess;
  const LaunchConfig config = RawRowsConfig(params);
  const cudaError_t error =
      detail::AllowClusterSharedMemory(reinterpret_cast<const void*>(detail::RawLogprobsKernel));
  if (error != cudaSuccess) return error;
  detail::RawLogprobsKernel<<<config.grid, config.block, config.dynamic_smem, stream>>>(
      params, FusedChunk(params.vocab_size));
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace samplerd
