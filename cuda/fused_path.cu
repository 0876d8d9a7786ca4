// The fused path: a cluster of blocks per row reads the row once into shared memory and does
// every pass there; block 0 finishes from the candidates the cluster gathers.
#include <cfloat>
#include <cmath>

#include <cooperative_groups.h>

#include "cuda/kernels/cluster.cuh"
#include "cuda/kernels/general.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// ---------------------------------------------------------------------------------------------
// The fused path: a cluster of kClusterBlocks blocks per row reads the row once into their
// shared memory and does every pass there; block 0 finishes from the candidates the cluster
// gathers through distributed shared memory. Rows it cannot finish this way (force top-N, or a
// kept set too wide for the candidate list) are written to the workspace and flagged (status
// 3) for SampleRowsKernel.

constexpr int kNumThresholds = 8;
// Distances from the max (nats) at which the cluster counts tokens and mass; the last admits
// every finite token. kLog2Thresholds: the same as log2 of exp(-distance).
__constant__ float kThresholds[kNumThresholds] = {1.0f, 2.0f, 3.0f, 4.5f, 7.0f, 11.0f, 18.0f,
                                                  FLT_MAX};
__constant__ float kLog2Thresholds[kNumThresholds] = {
    -1.0f * 1.4426950408889634f,  -2.0f * 1.4426950408889634f,  -3.0f * 1.4426950408889634f,
    -4.5f * 1.4426950408889634f,  -7.0f * 1.4426950408889634f,  -11.0f * 1.4426950408889634f,
    -18.0f * 1.4426950408889634f, -FLT_MAX};
// The gather admits tokens up to this much further (log2 units) than the chosen threshold:
// more than the error of the fast pass, so every token whose exact distance is within the
// threshold is gathered, and what is gathered beyond it ranks after them.
constexpr float kGatherSlack = 1e-2f;

// One block's partial results, as a flat array so that the cluster fetches it with one
// remote load per value, all in parallel: [z, count[12], mass[12]].
constexpr int kPartialValues = 1 + 2 * kNumThresholds;

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kClusterThreads, 2)
    ClusterSampleKernel(const __grid_constant__ StepParams p, int chunk) {
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int j = p.fused_jobs != nullptr ? p.fused_jobs[blockIdx.x / kClusterBlocks]
                                         : static_cast<int>(blockIdx.x / kClusterBlocks);
  const bool timed = ProbeTimes() != nullptr && blockIdx.x / kClusterBlocks == 0 && rank == 0;
  auto stage = [&](int k) {
    if (timed && threadIdx.x == 0) ProbeTimes()[k] = GlobalTimer();
  };
  stage(0);
  extern __shared__ float xs[];
  __shared__ Shared sh;
  __shared__ float part_max;
  __shared__ float part_min;
  __shared__ int part_bad;
  __shared__ double part[kPartialValues];
  __shared__ double all[kClusterBlocks][kPartialValues];
  __shared__ float all_max[kClusterBlocks];
  __shared__ float all_min[kClusterBlocks];
  __shared__ int all_bad[kClusterBlocks];
  const RowJob job = p.jobs[j];
  RowResult& out = p.results[j];
  const int V = p.vocab_size;
  const int lo = rank * chunk;
  const int n = max(0, min(V, lo + chunk) - lo);
  const bool prompt = job.kind == kRowPrompt;

  // Load the chunk once (padding is never read), checking NaN/+inf, applying the grammar mask
  // and taking the max in the same pass; then the sparse penalties.
  int bad = 0;
  float m = kNegInf, mn = INFINITY;
  auto load_chunk = [&]() { LoadChunk(p, job, lo, n, xs, &bad, &m, &mn); };
  load_chunk();
  stage(1);
  m = BlockReduce(m, MaxOp(), sh.scratch_f);
  mn = -BlockReduce(-mn, MaxOp(), sh.scratch_f);
  bad = BlockReduce(bad, OrOp(), sh.scratch_i);
  if (threadIdx.x == 0) {
    part_max = m;
    part_min = mn;
    part_bad = bad;
  }
  cluster.sync();
  // Eight threads fetch the eight partials (distributed shared memory), in parallel.
  if (threadIdx.x < kClusterBlocks) {
    all_max[threadIdx.x] = *cluster.map_shared_rank(&part_max, static_cast<int>(threadIdx.x));
    all_min[threadIdx.x] = *cluster.map_shared_rank(&part_min, static_cast<int>(threadIdx.x));
    all_bad[threadIdx.x] = *cluster.map_shared_rank(&part_bad, static_cast<int>(threadIdx.x));
  }
  __syncthreads();
  float x_max = kNegInf, x_min = INFINITY;
  int any_bad = 0;
  for (int r = 0; r < kClusterBlocks; ++r) {
    x_max = fmaxf(x_max, all_max[r]);
    x_min = fminf(x_min, all_min[r]);
    any_bad |= all_bad[r];
  }
  cluster.sync();  // every block has read `part` before it is rewritten below
  stage(2);
  // Force top-N rows go to the general algorithm, which checks the temperature itself. So
  // does this path for top-nσ rows, after the cut below: only the values the cut keeps must
  // stay in float32 range at temperature T (SPEC 3).
  const bool force = !prompt && job.force_top_n > 0 && job.force_top_n < V;
  const bool sigma = !prompt && !force && job.top_n_sigma > 0.0f;
  const int32_t fault = RowFault(any_bad, x_min, x_max, job.temperature, !force && !sigma);
  if (fault != 0) {
    if (rank == 0 && threadIdx.x == 0) out.status = fault;
    return;
  }
  // Rows the candidates cannot finish: the cluster writes x to the workspace, then block 0
  // runs the general algorithm on it (no second launch).
  auto fallback = [&](bool reload) {
    if (reload) {  // xs holds s = x / T by now: read x again
      __syncthreads();
      load_chunk();
      __syncthreads();
    }
    float* x = p.workspace + static_cast<int64_t>(j) * V + lo;
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = xs[i];
    if (threadIdx.x == 0) p.row_max[j] = OrderKey(x_max);
    __threadfence();
    cluster.sync();  // every chunk of x is written and visible
    if (rank == 0) SampleRowGeneral(p, j, sh);
  };
  if (force) {
    fallback(false);
    return;
  }
  if (sigma) {
    // Top-nσ (SPEC 3 step 4) on the resident row: the finite x's mean, then their population
    // deviation (two passes, as the CPU), each a block sum then the cluster's in rank order;
    // x < M - n * sigma (float64) becomes -inf in place, so every pass below sees the kept
    // row. The temperature check then runs over the kept values only.
    double sum = 0.0, finite = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xs[i];
      if (v != kNegInf) {
        sum += v;
        finite += 1.0;
      }
    }
    double moments[2] = {BlockReduce(sum, SumOp(), sh.scratch_d),
                         BlockReduce(finite, SumOp(), sh.scratch_d)};
    ClusterCombine(cluster, moments, SumOp());
    finite = moments[1];
    const double mean = moments[0] / finite;
    double squares = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xs[i];
      if (v != kNegInf) {
        const double d = static_cast<double>(v) - mean;
        squares += d * d;
      }
    }
    double deviation[1] = {BlockReduce(squares, SumOp(), sh.scratch_d)};
    ClusterCombine(cluster, deviation, SumOp());
    const double floor = static_cast<double>(x_max) -
                         static_cast<double>(job.top_n_sigma) * sqrt(deviation[0] / finite);
    float kept_min = INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xs[i];
      if (v == kNegInf) continue;
      if (static_cast<double>(v) < floor) {
        xs[i] = kNegInf;
      } else {
        kept_min = fminf(kept_min, v);
      }
    }
    // The cluster's kept minimum, as the maximum of the negated values.
    double neg_min[1] = {BlockReduce(-kept_min, MaxOp(), sh.scratch_f)};
    ClusterCombine(cluster, neg_min, MaxOp());
    const int32_t cut_fault =
        RowFault(0, static_cast<float>(-neg_min[0]), x_max, job.temperature, /*check_temperature=*/true);
    if (cut_fault != 0) {
      if (rank == 0 && threadIdx.x == 0) out.status = cut_fault;
      return;
    }
  }
  const float T = job.temperature;
  const float M = x_max / T;
  // Z and, per distance threshold, the tokens and mass within it.
  double z = 0.0;
  int count[kNumThresholds];
  float mass[kNumThresholds];
#pragma unroll
  for (int t = 0; t < kNumThresholds; ++t) {
    count[t] = 0;
    mass[t] = 0.0f;
  }
  // This pass only chooses how many candidates to gather, and Z only feeds top-p (with the
  // CPU's 1e-5 logprob tolerance): so it uses x * (log2(e) / T) and exp2f, a few instructions an
  // element. The candidates' exact scores x / T are computed when they are gathered, and the
  // gather widens the distance by kGatherSlack so that it holds the exact prefix (below).
  const float scale = Log2eOverT(T);
  float z4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto visit = [&](int i, int lane4) {
    const float v = xs[i];
    const float t = (v - x_max) * scale;  // log2 of exp(s - M); -inf for removed tokens
    const float e = exp2f(t);
    z4[lane4] += e;
    if (ProbeFlags() & 1) return;
#pragma unroll
    for (int k = 0; k < kNumThresholds; ++k) {
      const bool in = t >= kLog2Thresholds[k];
      count[k] += in;
      mass[k] += in ? e : 0.0f;
    }
  };
  const int stride = blockDim.x;
  int i = threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    visit(i, 0);
    visit(i + stride, 1);
    visit(i + 2 * stride, 2);
    visit(i + 3 * stride, 3);
  }
  for (; i < n; i += stride) visit(i, 0);
  z = static_cast<double>(z4[0]) + static_cast<double>(z4[1]) + static_cast<double>(z4[2]) +
      static_cast<double>(z4[3]);
  // One multi-value block reduction: warps by shuffles, then a fixed sum over warps.
  stage(7);
  if (!(ProbeFlags() & 2)) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double vals[1 + 2 * kNumThresholds];
    vals[0] = z;
#pragma unroll
    for (int t = 0; t < kNumThresholds; ++t) {
      vals[1 + t] = count[t];
      vals[1 + kNumThresholds + t] = mass[t];
    }
#pragma unroll
    for (int k = 0; k < 1 + 2 * kNumThresholds; ++k) {
      double v = vals[k];
      for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, offset);
      if (lane == 0) sh.cum[warp * (1 + 2 * kNumThresholds) + k] = v;  // cum is free until the finish
    }
    __syncthreads();
    if (threadIdx.x < 1 + 2 * kNumThresholds) {
      double total = 0.0;
      for (int w = 0; w < kClusterThreads / 32; ++w) total += sh.cum[w * (1 + 2 * kNumThresholds) + threadIdx.x];
      const int k = threadIdx.x;
      part[k] = total;
    }
  }
  cluster.sync();
  // Every block makes the same decision from the same partials, summed in rank order.
  __shared__ int chosen;
  __shared__ double z_total;
  for (int i = threadIdx.x; i < kClusterBlocks * kPartialValues; i += blockDim.x) {
    all[i / kPartialValues][i % kPartialValues] =
        cluster.map_shared_rank(part, i / kPartialValues)[i % kPartialValues];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double Z = 0.0;
    int counts[kNumThresholds];
    double masses[kNumThresholds];
    for (int t = 0; t < kNumThresholds; ++t) {
      counts[t] = 0;
      masses[t] = 0.0;
    }
    for (int r = 0; r < kClusterBlocks; ++r) {
      Z += all[r][0];
      for (int t = 0; t < kNumThresholds; ++t) {
        counts[t] += static_cast<int>(all[r][1 + t]);
        masses[t] += all[r][1 + kNumThresholds + t];
      }
    }
    const bool top_k = job.top_k > 0 && job.top_k < V;
    const bool top_p = job.top_p < 1.0f;
    const float min_p = prompt ? 0.0f : job.min_p;
    const int finite = counts[kNumThresholds - 1];
    int pick = -1;
    for (int t = 0; t < kNumThresholds && pick < 0; ++t) {
      bool enough;
      if (counts[t] == finite) {
        enough = true;
      } else if (top_k) {
        enough = counts[t] >= job.top_k;
      } else if (top_p) {
        // More mass than top_p, with a margin over the float per-thread sums.
        enough = masses[t] > static_cast<double>(job.top_p) * Z * (1.0 + 1e-4);
      } else if (min_p > 0.0f) {
        enough = kThresholds[t] >= -logf(min_p) + 0.01f;
      } else {
        enough = false;
      }
      if (enough) pick = t;
    }
    chosen = (pick >= 0 && counts[pick] <= kCandidateCapacity) ? pick : -1;
    z_total = Z;
  }
  __syncthreads();
  stage(3);
  const int pick = chosen;
  const double Z = z_total;
  if (pick < 0) {
    cluster.sync();  // every block has finished reading `part`
    fallback(sigma);  // a top-nσ row's xs holds the cut: the general algorithm cuts x itself
    return;
  }
  // Gather: each block lists its tokens within the chosen distance; block 0 appends the rest.
  if (threadIdx.x == 0) sh.count = 0;
  __syncthreads();
  const float limit = kLog2Thresholds[pick] - kGatherSlack;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xs[i];
    if (v == kNegInf) continue;
    if ((v - x_max) * scale >= limit) {
      const int slot = atomicAdd(&sh.count, 1);
      if (slot < kCandidateCapacity) {  // beyond it: counted, then the general path
        sh.cand_id[slot] = lo + i;
        sh.cand_s[slot] = v / T;  // the exact score
      }
    }
  }
  cluster.sync();
  stage(4);
  __shared__ int total;
  // The slack may gather a few more than counted: past the capacity, take the general path.
  __shared__ int overflow;
  if (threadIdx.x == 0) {
    int gathered = 0;
    for (int r = 0; r < kClusterBlocks; ++r) gathered += cluster.map_shared_rank(&sh, r)->count;
    overflow = gathered > kCandidateCapacity;
  }
  __syncthreads();
  if (overflow) {
    cluster.sync();
    fallback(sigma);
    return;
  }
  if (rank == 0) {
    __shared__ int counts[kClusterBlocks];
    __shared__ int offsets[kClusterBlocks];
    if (threadIdx.x < kClusterBlocks) {
      counts[threadIdx.x] = cluster.map_shared_rank(&sh, static_cast<int>(threadIdx.x))->count;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int acc = 0;
      for (int r = 0; r < kClusterBlocks; ++r) {
        offsets[r] = acc;
        acc += counts[r];
      }
      total = acc;
    }
    __syncthreads();
    // All remote lists at once: thread i copies entry i of the concatenation.
    for (int i = counts[0] + threadIdx.x; i < total; i += blockDim.x) {
      int r = 1;
      while (r + 1 < kClusterBlocks && offsets[r + 1] <= i) ++r;
      const Shared* remote = cluster.map_shared_rank(&sh, r);
      sh.cand_id[i] = remote->cand_id[i - offsets[r]];
      sh.cand_s[i] = remote->cand_s[i - offsets[r]];
    }
    __syncthreads();
  }
  cluster.sync();  // the other blocks' lists stay alive until block 0 has copied them
  stage(5);
  if (rank != 0) return;
  FinishCandidates(sh, job, out, V, M, Z, total, /*sorted=*/false);
  __syncthreads();
  stage(6);
}

}  // namespace detail

int FusedChunk(int32_t vocab_size) {
  const int per_block = (vocab_size + detail::kClusterBlocks - 1) / detail::kClusterBlocks;
  return (per_block + 7) / 8 * 8;
}

bool FusedPathFits(int32_t vocab_size) {
  return static_cast<size_t>(FusedChunk(vocab_size)) * sizeof(float) <= detail::kMaxFusedChunkBytes;
}

LaunchConfig FusedRowsConfig(const StepParams& params) {
  const int jobs = params.fused_jobs != nullptr ? params.num_fused : params.num_jobs;
  const size_t smem = static_cast<size_t>(FusedChunk(params.vocab_size)) * sizeof(float);
  return LaunchConfig{"ClusterSampleKernel", dim3(jobs * detail::kClusterBlocks),
                      dim3(detail::kClusterThreads), smem};
}

cudaError_t LaunchFusedRows(const StepParams& params, cudaStream_t stream) {
  const LaunchConfig config = FusedRowsConfig(params);
  if (config.grid.x == 0) return cudaSuccess;
  const cudaError_t error =
      detail::AllowClusterSharedMemory(reinterpret_cast<const void*>(detail::ClusterSampleKernel));
  if (error != cudaSuccess) return error;
  detail::ClusterSampleKernel<<<config.grid, config.block, config.dynamic_smem, stream>>>(
      params, FusedChunk(params.vocab_size));
  return cudaGetLastError();
}

// This translation unit's copy of the stage probe (general_path.cu's SetStageProbe sets
// every copy).
cudaError_t SetStageProbeFused(const StageProbe& probe) {
  return detail::SetThisUnitsStageProbe(probe);
}

}  // namespace cuda
}  // namespace samplerd
