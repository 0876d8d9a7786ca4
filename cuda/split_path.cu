// The split path, for rows with a small top-k: independent blocks over chunks of each row,
// then one finishing block per row.
#include <cfloat>
#include <cmath>

#include "cuda/kernels/general.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// ---------------------------------------------------------------------------------------------
// The split path, for rows with a small top-k (1 <= top_k <= kSplitMaxK, SplitPathEligible):
// the kept set, and so every output, lies among the row's top_k tokens in the order (s desc,
// id asc). The row is cut into chunks of kSplitChunk tokens, one independent block each
// (SplitChunkKernel): it reads its chunk once into shared memory and leaves the chunk's max of
// x, its Z partial and its own top_k tokens, exactly, in the split scratch. A second launch
// (SplitFinishKernel), one block per row, merges the chunks' lists (the row's top_k is among
// their union), then runs FinishCandidates. No cluster and no resident row: many chunks are in
// flight on every SM, which the fused path (a row resident in a cluster through a long chain of
// dependent passes) cannot have when R is large. A chunk whose candidates overflow its list (a
// flat row: very many equal values) flags the row, and the finishing block runs the general
// algorithm on it instead. Chunks, their order and every reduction depend on V only.

constexpr int kSplitThreads = 256;
constexpr int kSplitCapacity = 512;   // tokens a chunk may collect before it overflows
constexpr int kSplitFinishThreads = 512;

struct SplitPartial {
  float max_x;    // the chunk's max of x (-inf: nothing finite in it)
  float min_x;    // the chunk's least finite x (+inf: nothing finite in it)
  float z;        // sum over the chunk of exp2((x - max_x) * log2(e) / T)
  int32_t bad;    // RowStatus bits: NaN / +inf in a real column, a penalty overflow
  int32_t count;  // tokens listed (min(top_k, finite tokens)), or -1: the list overflowed
};

// Where each split job's partials and lists live in p.split_scratch (SplitScratchBytes).
struct SplitLayout {
  SplitPartial* partials;  // [num_split][chunks]
  float* cand_s;           // [num_split][chunks][kSplitMaxK], s = x / T, in order
  int32_t* cand_id;        // the same, token ids
  int chunks;
  __device__ explicit SplitLayout(const StepParams& p) {
    chunks = (p.vocab_size + kSplitChunk - 1) / kSplitChunk;
    const int64_t slots = static_cast<int64_t>(p.num_split) * chunks;
    partials = static_cast<SplitPartial*>(p.split_scratch);
    cand_s = reinterpret_cast<float*>(partials + slots);
    cand_id = reinterpret_cast<int32_t*>(cand_s + slots * kSplitMaxK);
  }
};

// (s, id) ranks before (t, jd) in the order "s desc, id asc".
__device__ __forceinline__ bool RanksBefore(float s, int id, float t, int jd) {
  return s > t || (s == t && id < jd);
}

// Room for at least kSplitBlocksPerSm blocks per SM in the register file (shared memory
// allows five).
constexpr int kSplitBlocksPerSm = 4;

__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSm) SplitChunkKernel(StepParams p) {
  __shared__ __align__(16) float xs[kSplitChunk];
  __shared__ float thread_max[kSplitThreads / 32];  // each warp's threshold
  __shared__ float coll_s[kSplitCapacity];
  __shared__ int coll_id[kSplitCapacity];
  __shared__ float scratch_f[32];
  __shared__ int scratch_i[32];
  __shared__ int collected;
  __shared__ float threshold;
  const int split_index = blockIdx.y;
  const int chunk = blockIdx.x;
  const int j = p.split_jobs[split_index];
  const RowJob job = p.jobs[j];
  const int V = p.vocab_size;
  const int lo = chunk * kSplitChunk;
  const int n = min(V, lo + kSplitChunk) - lo;
  const int elem = p.dtype == kF32 ? 4 : 2;
  const char* row = static_cast<const char*>(p.logits) +
                    static_cast<int64_t>(job.logits_row) * p.row_stride * elem;
  const SplitLayout layout(p);
  const int64_t slot = static_cast<int64_t>(split_index) * layout.chunks + chunk;
  // Benchmarks: %globaltimer at stage ends of split job 0's chunk 0 (stage_times[9..14]).
  const bool timed = ProbeTimes() != nullptr && split_index == 0 && chunk == 0;
  auto stage = [&](int k) {
    if (timed && threadIdx.x == 0) ProbeTimes()[k] = GlobalTimer();
  };
  stage(9);
  if (threadIdx.x == 0) {
    collected = 0;
    threshold = kNegInf;
  }
  int bad;
  float m, mn;
  LoadChunk(p, job, row, lo, n, xs, &bad, &m, &mn);
  stage(10);
  m = BlockReduce(m, MaxOp(), scratch_f);  // its first barrier publishes xs
  mn = -BlockReduce(-mn, MaxOp(), scratch_f);
  bad = BlockReduce(bad, OrOp(), scratch_i);
  const float T = job.temperature;
  const int K = job.top_k;
  // Z's partial (exp2 of x * log2(e) / T: Z only feeds top-p and the logprobs' normaliser, within
  // the CPU's 1e-5 tolerance) and each thread's max over its tokens t, t + 256, ...
  const float scale = 1.4426950408889634f / T;
  float tmax = kNegInf, z = 0.0f;
  if (m != kNegInf) {
    for (int i = threadIdx.x; i < n; i += kSplitThreads) {
      const float v = xs[i];
      tmax = fmaxf(tmax, v);
      z += exp2f((v - m) * scale);
    }
  }
  z = BlockReduce(z, SumOp(), scratch_f);
  stage(11);
  // A threshold t with at least K tokens of the chunk >= t: in every warp, the k-th largest of
  // its 32 thread maxima (k = ceil(K / 8), ties by lane), then the least of the eight. Each
  // warp has k threads, each holding a token >= its value >= t: 8k >= K tokens in all. Division
  // by T is monotone, so every token of the chunk's top K by (s desc, id asc) has s >= t / T.
  {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k = (K + kSplitThreads / 32 - 1) / (kSplitThreads / 32);
    int r = 0;
#pragma unroll
    for (int u = 0; u < 32; ++u) {
      const float w = __shfl_sync(0xFFFFFFFFu, tmax, u);
      r += w > tmax || (w == tmax && u < lane);
    }
    if (r == k - 1) thread_max[warp] = tmax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = thread_max[0];
      for (int w = 1; w < kSplitThreads / 32; ++w) t = fminf(t, thread_max[w]);
      threshold = t;
    }
  }
  __syncthreads();
  stage(12);
  const float s_min = threshold / T;
  // A cheap filter on x before the exact division: v / T >= s_min (both rounded) implies v is
  // within a few ulps of the threshold or above it, so this margin loses nothing.
  const float t_x = threshold;
  const float x_lo = t_x == kNegInf ? kNegInf : t_x - fabsf(t_x) * 0x1.0p-20f - 1e-30f;
  for (int i = threadIdx.x; i < n; i += kSplitThreads) {
    const float v = xs[i];
    if (!(v >= x_lo) || v == kNegInf) continue;
    const float sv = v / T;  // the exact score, as FinishCandidates and the CPU take it
    if (sv >= s_min) {
      const int at = atomicAdd(&collected, 1);  // slots in any order: only ranks are kept
      if (at < kSplitCapacity) {
        coll_s[at] = sv;
        coll_id[at] = lo + i;
      }
    }
  }
  __syncthreads();
  stage(13);
  const int nc = collected;
  SplitPartial* part = layout.partials + slot;
  if (nc > kSplitCapacity) {
    if (threadIdx.x == 0) *part = SplitPartial{m, mn, z, bad, -1};
    return;
  }
  // The chunk's top K: each collected token's rank among the collected (a total order).
  for (int a = threadIdx.x; a < nc; a += kSplitThreads) {
    const float sa = coll_s[a];
    const int ia = coll_id[a];
    int r = 0;
#pragma unroll 8
    for (int b = 0; b < nc; ++b) r += RanksBefore(coll_s[b], coll_id[b], sa, ia);
    if (r < K) {
      layout.cand_s[slot * kSplitMaxK + r] = sa;
      layout.cand_id[slot * kSplitMaxK + r] = ia;
    }
  }
  if (threadIdx.x == 0) *part = SplitPartial{m, mn, z, bad, min(nc, K)};
  stage(14);
}

__global__ void __launch_bounds__(kSplitFinishThreads, 2) SplitFinishKernel(StepParams p) {
  __shared__ Shared sh;
  __shared__ int list_base[kSplitMaxChunks];
  __shared__ int list_count[kSplitMaxChunks];
  __shared__ float row_x_max;
  __shared__ double row_z;
  __shared__ float row_x_min;
  __shared__ int row_bad;    // RowStatus bits of the chunks
  __shared__ int row_flat;   // a chunk's list overflowed: the general algorithm
  __shared__ int total;
  __shared__ SplitPartial chunk_part[kSplitMaxChunks];
  const int split_index = blockIdx.x;
  const int j = p.split_jobs[split_index];
  const RowJob job = p.jobs[j];
  RowResult& out = p.results[j];
  const int V = p.vocab_size;
  const SplitLayout layout(p);
  const int C = layout.chunks;
  const SplitPartial* parts = layout.partials + static_cast<int64_t>(split_index) * C;
  const float T = job.temperature;
  const int K = job.top_k;
  const bool timed = ProbeTimes() != nullptr && split_index == 0;  // stage_times[15..17]
  auto stage = [&](int k) {
    if (timed && threadIdx.x == 0) ProbeTimes()[k] = GlobalTimer();
  };
  stage(15);
  if (threadIdx.x < C) chunk_part[threadIdx.x] = parts[threadIdx.x];  // all loads in flight at once
  __syncthreads();
  if (threadIdx.x == 0) {
    float x_max = kNegInf, x_min = INFINITY;
    int bad = 0, flat = 0, listed = 0;
    for (int c = 0; c < C; ++c) {
      const SplitPartial q = chunk_part[c];
      x_max = fmaxf(x_max, q.max_x);
      x_min = fminf(x_min, q.min_x);
      bad |= q.bad;
      flat |= q.count < 0 ? 1 : 0;
      list_base[c] = listed;
      list_count[c] = max(q.count, 0);
      listed += max(q.count, 0);
    }
    // Z = sum over chunks, in chunk order, of z_c * exp2((max_c - max) * log2(e) / T).
    double z = 0.0;
    const double scale = 1.4426950408889634 / static_cast<double>(T);
    for (int c = 0; c < C; ++c) {
      const SplitPartial q = chunk_part[c];
      if (q.max_x != kNegInf) {
        z += static_cast<double>(q.z) * exp2(static_cast<double>(q.max_x - x_max) * scale);
      }
    }
    row_x_max = x_max;
    row_z = z;
    row_x_min = x_min;
    row_bad = bad;
    row_flat = flat;
    total = listed;
  }
  __syncthreads();
  const float x_max = row_x_max;
  const int32_t fault = RowFault(row_bad, row_x_min, x_max, T, /*check_temperature=*/true);
  if (fault != 0) {
    if (threadIdx.x == 0) out.status = fault;
    return;
  }
  if (row_flat) {
    // A flat row: x into the workspace (steps 1-3 again), then the general algorithm.
    const int elem = p.dtype == kF32 ? 4 : 2;
    const char* row = static_cast<const char*>(p.logits) +
                      static_cast<int64_t>(job.logits_row) * p.row_stride * elem;
    float* x = p.workspace + static_cast<int64_t>(j) * V;
    int bad;
    float m, mn;
    LoadChunk(p, job, row, 0, V, x, &bad, &m, &mn);
    m = BlockReduce(m, MaxOp(), sh.scratch_f);
    if (threadIdx.x == 0) p.row_max[j] = OrderKey(m);
    __syncthreads();
    SampleRowGeneral(p, j, sh);
    return;
  }
  // Every chunk's list, then each token's rank in the row: its place in its own (sorted) list
  // plus, by binary search, how many tokens of every other list rank before it.
  int* ids = reinterpret_cast<int*>(sh.cum);  // cum is free until FinishCandidates
  const int listed = total;
  for (int e = threadIdx.x; e < C * K; e += blockDim.x) {
    const int c = e / K, i = e % K;
    if (i < list_count[c]) {
      const int64_t from = (static_cast<int64_t>(split_index) * C + c) * kSplitMaxK + i;
      sh.cand_key[list_base[c] + i] = layout.cand_s[from];
      ids[list_base[c] + i] = layout.cand_id[from];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < C * K; e += blockDim.x) {
    const int c = e / K, i = e % K;
    if (i >= list_count[c]) continue;
    const float sa = sh.cand_key[list_base[c] + i];
    const int ia = ids[list_base[c] + i];
    int r = i;
    for (int c2 = 0; c2 < C; ++c2) {
      if (c2 == c) continue;
      int lo = 0, hi = list_count[c2];
      const int b0 = list_base[c2];
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (RanksBefore(sh.cand_key[b0 + mid], ids[b0 + mid], sa, ia)) lo = mid + 1; else hi = mid;
      }
      r += lo;
    }
    if (r < K) {
      sh.cand_s[r] = sa;
      sh.cand_id[r] = ia;
    }
  }
  __syncthreads();
  stage(16);
  FinishCandidates(sh, job, out, V, x_max / T, row_z, min(listed, K));
  __syncthreads();
  stage(17);
}

}  // namespace detail

size_t SplitScratchBytes(int32_t num_split, int32_t vocab_size) {
  const size_t slots =
      static_cast<size_t>(num_split) * ((vocab_size + kSplitChunk - 1) / kSplitChunk);
  return slots * (sizeof(detail::SplitPartial) + kSplitMaxK * (sizeof(float) + sizeof(int32_t)));
}

cudaError_t LaunchSplitRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_split == 0) return cudaSuccess;
  const dim3 grid((params.vocab_size + kSplitChunk - 1) / kSplitChunk, params.num_split);
  detail::SplitChunkKernel<<<grid, detail::kSplitThreads, 0, stream>>>(params);
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  detail::SplitFinishKernel<<<params.num_split, detail::kSplitFinishThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

// This translation unit's copy of the stage probe (general_path.cu's SetStageProbe sets
// every copy).
cudaError_t SetStageProbeSplit(const StageProbe& probe) {
  return detail::SetThisUnitsStageProbe(probe);
}

}  // namespace cuda
}  // namespace samplerd
