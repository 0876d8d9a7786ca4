// The split path, for rows with a small top-k: independent blocks over chunks of each row,
// the last of which finishes the row.
#include <cfloat>
#include <cmath>

#include "cuda/kernels/general.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// ---------------------------------------------------------------------------------------------
// The split path, for rows with a small top-k (1 <= top_k <= kSplitMaxK, SplitPathEligible):
// the kept set, and so every output, lies among the row's top_k tokens in the order (s desc,
// id asc). The row is cut into chunks of kSplitChunk tokens, one independent block each: it
// reads its chunk once into shared memory and leaves the chunk's max of x, its Z partial and
// its own top_k tokens, exactly, in the split scratch. The last of a row's chunk blocks to
// finish (an arrival counter per row) then merges the chunks' lists (the row's top_k is among
// their union) and runs FinishCandidates, in the same launch: no second launch to wait for,
// and rows finish while other rows' chunks still stream. No cluster and no resident row: many
// chunks are in flight on every SM, which the fused path (a row resident in a cluster through
// a long chain of dependent passes) cannot have when R is large. A chunk whose candidates
// overflow its list (a flat row: very many equal values) flags the row, and the finishing block
// runs the general algorithm on it instead. Chunks, their order and every reduction depend on
// V only.

constexpr int kSplitThreads = 256;
constexpr int kSplitWarps = kSplitThreads / 32;
constexpr int kSplitCapacity = 512;   // tokens a chunk may collect before it overflows
// The finishing block narrows the chunks' union by radix rounds until at most this many
// remain, then ranks those against each other.
constexpr int kSplitSurvivors = 128;

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

// Another block's partial, from L2 (this SM's L1 is not coherent with the writer's).
__device__ __forceinline__ SplitPartial LoadPartial(const SplitPartial* q) {
  return SplitPartial{__ldcg(&q->max_x), __ldcg(&q->min_x), __ldcg(&q->z), __ldcg(&q->bad),
                      __ldcg(&q->count)};
}

// (s, id) ranks before (t, jd) in the order "s desc, id asc".
__device__ __forceinline__ bool RanksBefore(float s, int id, float t, int jd) {
  return s > t || (s == t && id < jd);
}

// Room for kSplitBlocksPerSm blocks per SM in the register file (64 registers a thread;
// shared memory allows four).
constexpr int kSplitBlocksPerSm = 4;

// The rank of each of the n entries (s[e], id[e]) among them, in the order (s desc, id asc),
// handed to emit(e, rank). When n is small against the block, g = 2^i threads share an entry
// (each counts a g-th of the others, then the group's lanes add up), so the chain a thread
// runs is n / g comparisons long. Entries are read through at(e) -> (s, id).
template <typename At, typename Emit>
__device__ void RankAmong(int n, At at, Emit emit) {
  int g = 1;
  while (g < 32 && 2 * g * n <= static_cast<int>(blockDim.x)) g <<= 1;
  for (int base = 0; base < n * g; base += blockDim.x) {  // block-uniform: all lanes shuffle
    const int t = base + threadIdx.x, a = t / g, part = t % g;
    int r = 0;
    float sa = 0.0f;
    int ia = 0;
    if (a < n) {
      at(a, &sa, &ia);
      for (int b = part; b < n; b += g) {
        float sb;
        int ib;
        at(b, &sb, &ib);
        r += RanksBefore(sb, ib, sa, ia);
      }
    }
    for (int o = g >> 1; o > 0; o >>= 1) r += __shfl_down_sync(0xFFFFFFFFu, r, o);
    if (a < n && part == 0) emit(a, r);
  }
}

// A block is a chunk first and, if it is its row's last, the row's finisher: the two phases
// share one piece of shared memory.
struct SplitChunkSmem {
  __align__(16) float xs[kSplitChunk];
  float coll_s[kSplitCapacity];
  int coll_id[kSplitCapacity];
};
struct SplitFinishSmem {
  Shared sh;
  int list_base[kSplitMaxChunks];   // each chunk's list in the union
  int list_count[kSplitMaxChunks];
  uint32_t cut_prefix, cut_mask;    // the radix narrowing's state
  int cut_digit, cut_done;
};
union SplitSmem {
  SplitChunkSmem chunk;
  SplitFinishSmem finish;
};

// The finishing phase of split job `split_index`, run by the row's last chunk block: combines
// the chunks' partials, takes the row's top_k from the union of their lists, and finishes the
// row. Every other block of the row has written its partial and list (arrival counter).
static __device__ __noinline__ void SplitFinishRow(const StepParams& p, int split_index, SplitFinishSmem& fs) {
  __shared__ float row_x_max, row_x_min;
  __shared__ double row_z;
  __shared__ int row_bad, row_flat, row_listed;
  Shared& sh = fs.sh;
  const int j = p.split_jobs[split_index];
  const RowJob job = p.jobs[j];
  RowResult& out = p.results[j];
  const int V = p.vocab_size;
  const SplitLayout layout(p);
  const int C = layout.chunks;
  const SplitPartial* parts = layout.partials + static_cast<int64_t>(split_index) * C;
  const float T = job.temperature;
  const int K = job.top_k;
  const int lane = threadIdx.x & 31;
  const bool timed = ProbeTimes() != nullptr && split_index == 0;  // stage_times[15..17]
  auto stage = [&](int k) {
    if (timed && threadIdx.x == 0) ProbeTimes()[k] = GlobalTimer();
  };
  stage(15);
  // Warp 0 combines the partials, chunk c in lane c % 32 (C <= 64): extremes, faults, each
  // list's place in the union, and Z = sum over chunks of
  // z_c * exp2((max_c - max) * log2(e) / T) in double, by a fixed shuffle tree (C only).
  if (threadIdx.x < 32) {
    const SplitPartial none{kNegInf, INFINITY, 0.0f, 0, 0};
    const SplitPartial q0 = lane < C ? LoadPartial(parts + lane) : none;
    const SplitPartial q1 = lane + 32 < C ? LoadPartial(parts + lane + 32) : none;
    float x_max = fmaxf(q0.max_x, q1.max_x), x_min = fminf(q0.min_x, q1.min_x);
    int bad = q0.bad | q1.bad, flat = (q0.count < 0) | (q1.count < 0);
    for (int o = 16; o > 0; o >>= 1) {
      x_max = fmaxf(x_max, __shfl_xor_sync(0xFFFFFFFFu, x_max, o));
      x_min = fminf(x_min, __shfl_xor_sync(0xFFFFFFFFu, x_min, o));
      bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, o);
      flat |= __shfl_xor_sync(0xFFFFFFFFu, flat, o);
    }
    // Each list's place in the union: a scan in chunk order.
    const int n0 = max(q0.count, 0), n1 = max(q1.count, 0);
    int inc0 = n0, inc1 = n1;
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xFFFFFFFFu, inc0, o), b = __shfl_up_sync(0xFFFFFFFFu, inc1, o);
      if (lane >= o) {
        inc0 += a;
        inc1 += b;
      }
    }
    const int total0 = __shfl_sync(0xFFFFFFFFu, inc0, 31);
    const int listed = total0 + __shfl_sync(0xFFFFFFFFu, inc1, 31);
    if (lane < C) {
      fs.list_base[lane] = inc0 - n0;
      fs.list_count[lane] = n0;
    }
    if (lane + 32 < C) {
      fs.list_base[lane + 32] = total0 + inc1 - n1;
      fs.list_count[lane + 32] = n1;
    }
    const double scale = 1.4426950408889634 / static_cast<double>(T);
    double z = 0.0;
    if (q0.max_x != kNegInf) z += static_cast<double>(q0.z) * exp2(static_cast<double>(q0.max_x - x_max) * scale);
    if (q1.max_x != kNegInf) z += static_cast<double>(q1.z) * exp2(static_cast<double>(q1.max_x - x_max) * scale);
    for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xFFFFFFFFu, z, o);
    if (lane == 0) {
      row_x_max = x_max;
      row_x_min = x_min;
      row_z = z;
      row_bad = bad;
      row_flat = flat;
      row_listed = listed;
    }
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
  // The union of the chunks' lists (at most C * K <= 2048: SplitPathEligible), keys in
  // sh.cand_key and ids in sh.cum's storage (free until FinishCandidates).
  const int listed = row_listed;
  float* u_s = sh.cand_key;
  int* u_id = reinterpret_cast<int*>(sh.cum);
  int* survivors = u_id + kCandidateCapacity;
  for (int e = threadIdx.x; e < C * K; e += blockDim.x) {
    const int c = e / K, i = e % K;
    if (i < fs.list_count[c]) {
      const int64_t from = (static_cast<int64_t>(split_index) * C + c) * kSplitMaxK + i;
      u_s[fs.list_base[c] + i] = __ldcg(layout.cand_s + from);
      u_id[fs.list_base[c] + i] = __ldcg(layout.cand_id + from);
    }
  }
  if (threadIdx.x == 0) {
    fs.cut_prefix = 0;
    fs.cut_mask = 0;
    fs.cut_done = 0;
  }
  __syncthreads();
  // Narrow the union to a prefix of its order that holds its top K: 8-bit radix rounds over
  // the order key of s, each keeping the digits at or above the one holding the K-th element,
  // until at most kSplitSurvivors remain (or the key is exhausted: only exact ties are left).
  // (Measured against a tree of pairwise merges by binary search, and against
  // warp-aggregated histogram counts: both slower on the H200.)
  int need = min(listed, K);
  for (int shift = 24; shift >= 0 && !fs.cut_done; shift -= 8) {
    const uint32_t prefix = fs.cut_prefix, mask = fs.cut_mask;
    for (int b = threadIdx.x; b < kDistanceBins; b += blockDim.x) sh.hist_count[b] = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < listed; e += blockDim.x) {
      const uint32_t k = OrderKey(u_s[e]);
      if ((k & mask) == prefix) atomicAdd(&sh.hist_count[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds digits 255 - 8l .. 248 - 8l (descending): a suffix scan from the top.
      unsigned int c[8], mine = 0;
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        c[d] = sh.hist_count[255 - 8 * lane - d];
        mine += c[d];
      }
      unsigned int inc = mine;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned int a = __shfl_up_sync(0xFFFFFFFFu, inc, o);
        if (lane >= o) inc += a;
      }
      unsigned int before = inc - mine;  // elements (of this round) in higher digits
      const unsigned int un = static_cast<unsigned int>(need);
      if (before < un && inc >= un) {  // exactly one lane
#pragma unroll
        for (int d = 0; d < 8; ++d) {
          if (before < un && before + c[d] >= un) {
            // Kept: the elements above this round's prefix (counted in earlier rounds:
            // K - need), plus this round's digits above d, plus digit d itself.
            fs.cut_digit = 255 - 8 * lane - d;
            fs.cut_done = (min(listed, K) - need) + static_cast<int>(before + c[d]) <= kSplitSurvivors;
            sh.count = need - static_cast<int>(before);  // the new need
          }
          before += c[d];
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      fs.cut_prefix = prefix | (static_cast<uint32_t>(fs.cut_digit) << shift);
      fs.cut_mask = mask | (255u << shift);
    }
    need = sh.count;
    __syncthreads();
  }
  // The survivors: every element whose masked key is at or above the cut (the mask keeps the
  // key's top bits, so the comparison is the order's), then their ranks among themselves.
  if (threadIdx.x == 0) sh.count = 0;
  __syncthreads();
  {
    const uint32_t prefix = fs.cut_prefix, mask = fs.cut_mask;
    for (int e = threadIdx.x; e < listed; e += blockDim.x) {
      if ((OrderKey(u_s[e]) & mask) >= prefix) survivors[atomicAdd(&sh.count, 1)] = e;
    }
  }
  __syncthreads();
  RankAmong(
      sh.count,
      [&](int a, float* sa, int* ia) {
        const int e = survivors[a];
        *sa = u_s[e];
        *ia = u_id[e];
      },
      [&](int a, int r) {
        if (r < K) {
          const int e = survivors[a];
          sh.cand_s[r] = u_s[e];
          sh.cand_id[r] = u_id[e];
        }
      });
  __syncthreads();
  const int n_cand = min(listed, K);
  stage(16);
  FinishCandidates(sh, job, out, V, x_max / T, row_z, n_cand, /*sorted=*/true);
  __syncthreads();
  stage(17);
}

__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSm) SplitRowKernel(StepParams p) {
  __shared__ __align__(16) SplitSmem smem;
  __shared__ float thread_max[kSplitWarps];  // each warp's threshold
  __shared__ float scratch_f[32];
  __shared__ int scratch_i[32];
  __shared__ int collected;
  __shared__ float threshold;
  __shared__ int last;
  float* const xs = smem.chunk.xs;
  float* const coll_s = smem.chunk.coll_s;
  int* const coll_id = smem.chunk.coll_id;
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
  if (threadIdx.x == 0) collected = 0;
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
    const int k = (K + kSplitWarps - 1) / kSplitWarps;
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
      for (int w = 1; w < kSplitWarps; ++w) t = fminf(t, thread_max[w]);
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
      // Slots in any order: only ranks are kept. (Warp-aggregated ballots measured slower
      // here: few threads of a warp take a token.)
      const int at = atomicAdd(&collected, 1);
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
  } else {
    // The chunk's top K: each collected token's rank among the collected (a total order).
    RankAmong(
        nc,
        [&](int a, float* sa, int* ia) {
          *sa = coll_s[a];
          *ia = coll_id[a];
        },
        [&](int a, int r) {
          if (r < K) {
            layout.cand_s[slot * kSplitMaxK + r] = coll_s[a];
            layout.cand_id[slot * kSplitMaxK + r] = coll_id[a];
          }
        });
    if (threadIdx.x == 0) *part = SplitPartial{m, mn, z, bad, min(nc, K)};
  }
  stage(14);
  // Arrival: every thread's writes reach the device before thread 0 counts this chunk in (the
  // threadfence-reduction pattern); the row's last arrival finishes it and re-arms the counter
  // for the next launch.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&p.split_arrivals[split_index], 1u) == static_cast<unsigned int>(layout.chunks - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) p.split_arrivals[split_index] = 0;
  SplitFinishRow(p, split_index, smem.finish);
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
  detail::SplitRowKernel<<<grid, detail::kSplitThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

// This translation unit's copy of the stage probe (general_path.cu's SetStageProbe sets
// every copy).
cudaError_t SetStageProbeSplit(const StageProbe& probe) {
  return detail::SetThisUnitsStageProbe(probe);
}

}  // namespace cuda
}  // namespace samplerd
