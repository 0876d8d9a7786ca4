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
// reads its chunk once into registers and leaves the chunk's max of x, its Z partial and the
// tokens at or above a threshold that keeps its own top_k (unranked; ranked down to its top_k
// only when they overflow the list) in the split scratch. The last of a row's chunk blocks to
// finish (an arrival counter per row) then merges the chunks' lists (the row's top_k is among
// their union) and runs FinishCandidates, in the same launch: no second launch to wait for,
// and rows finish while other rows' chunks still stream. No cluster and no resident row: many
// chunks are in flight on every SM, which the fused path (a row resident in a cluster through
// a long chain of dependent passes) cannot have when R is large. A chunk with more than
// kSplitCapacity tokens at or above its threshold (a flat row: very many equal values) flags
// the row, and the finishing block runs the general algorithm on it instead. Chunks, their
// order and every reduction depend on V only.

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
  int32_t count;  // tokens listed (a superset of the chunk's top_k), or -1: a flat chunk
};

// Where each split job's partials and lists live in p.split_scratch (SplitScratchBytes).
struct SplitLayout {
  SplitPartial* partials;  // [num_split][chunks]
  float* cand_x;           // [num_split][chunks][kSplitMaxK], x (the finisher takes s = x / T), any order
  int32_t* cand_id;        // the same, token ids
  float* maxima;           // [num_split][chunks][64]: the chunk's 64 largest thread maxima, descending
  int chunks;
  __device__ explicit SplitLayout(const StepParams& p) {
    chunks = (p.vocab_size + kSplitChunk - 1) / kSplitChunk;
    const int64_t slots = static_cast<int64_t>(p.num_split) * chunks;
    partials = static_cast<SplitPartial*>(p.split_scratch);
    cand_x = reinterpret_cast<float*>(partials + slots);
    cand_id = reinterpret_cast<int32_t*>(cand_x + slots * kSplitMaxK);
    maxima = reinterpret_cast<float*>(cand_id + slots * kSplitMaxK);
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
  __align__(16) float xs[kSplitChunk];  // the chunk, only to apply its token updates
  float coll_x[kSplitCapacity];
  int coll_id[kSplitCapacity];
};
struct SplitFinishSmem {
  Shared sh;
  int list_base[kSplitMaxChunks];   // each chunk's list in the union
  int list_count[kSplitMaxChunks];
  uint32_t cut_prefix, cut_mask;    // the radix narrowing's state
  int cut_digit, cut_done;
  float s_min;                      // the bound's score (SplitFinishRow)
  int survived;
};
union SplitSmem {
  SplitChunkSmem chunk;
  SplitFinishSmem finish;
};

// Bitonic merges in one warp's registers, for the chunk's threshold: the largest 64 of the
// block's thread maxima, from each warp's 32 sorted descending. A sequence of 64 is held as
// `hi` (elements 0-31, one a lane) and `lo` (32-63).
struct Top64 {
  float hi, lo;
};

// A bitonic sequence of 32 (one a lane), sorted descending: half-cleaners of stride 16 .. 1.
__device__ __forceinline__ float BitonicMergeDesc32(float v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 16; h > 0; h >>= 1) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, v, h);
    v = (lane & h) != 0 ? fminf(v, other) : fmaxf(v, other);
  }
  return v;
}

// Any 32 values (one a lane) sorted descending: bitonic runs of 2, 4, .. 16 alternating in
// direction (by bit k of the lane), then the merge of the bitonic 32 they form.
__device__ __forceinline__ float BitonicSortDesc32(float v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 2; k <= 16; k <<= 1) {
#pragma unroll
    for (int h = k >> 1; h > 0; h >>= 1) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, v, h);
      v = ((lane & k) == 0) == ((lane & h) == 0) ? fmaxf(v, other) : fminf(v, other);
    }
  }
  return BitonicMergeDesc32(v);
}

// Two descending 32-sequences a and b, merged descending: a followed by b reversed is bitonic;
// its stride-32 half-cleaner puts the larger 32 in hi and the rest in lo, each bitonic.
__device__ __forceinline__ Top64 Merge32(float a, float b) {
  const float b_rev = __shfl_sync(0xFFFFFFFFu, b, 31 - (threadIdx.x & 31));
  return Top64{BitonicMergeDesc32(fmaxf(a, b_rev)), BitonicMergeDesc32(fminf(a, b_rev))};
}

// The largest 64 of two descending 64-sequences, descending: element i is max(p[i], q[63 - i])
// (a bitonic sequence holding the largest 64), then a bitonic merge of 64.
__device__ __forceinline__ Top64 MergeTop64(Top64 p, Top64 q) {
  const int mirror = 31 - (threadIdx.x & 31);
  const float hi = fmaxf(p.hi, __shfl_sync(0xFFFFFFFFu, q.lo, mirror));
  const float lo = fmaxf(p.lo, __shfl_sync(0xFFFFFFFFu, q.hi, mirror));
  return Top64{BitonicMergeDesc32(fmaxf(hi, lo)), BitonicMergeDesc32(fminf(hi, lo))};
}

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
    float* x = p.workspace + static_cast<int64_t>(j) * V;
    int bad;
    float m, mn;
    LoadChunk(p, job, 0, V, x, &bad, &m, &mn);
    m = BlockReduce(m, MaxOp(), sh.scratch_f);
    if (threadIdx.x == 0) p.row_max[j] = OrderKey(m);
    __syncthreads();
    SampleRowGeneral(p, j, sh);
    return;
  }
  // A bound on the row's K-th largest x: the K-th largest of the chunks' thread maxima, from
  // each chunk's 64 largest (K <= 64; they are x of distinct tokens, so at least K tokens have
  // x >= it, and the row's K-th largest s is >= its score s_min: rounding x / T is monotone).
  // Every warp merges the lists of chunks warp, warp + 8, ..; warp 0 merges the eight below.
  static_assert(kSplitWarps * 64 * sizeof(float) <= sizeof(sh.hist_mass), "merge space");
  float(*merged)[64] = reinterpret_cast<float(*)[64]>(sh.hist_mass);  // free until the finish
  {
    const int warp = threadIdx.x >> 5;
    const float* maxima = layout.maxima + static_cast<int64_t>(split_index) * C * 64;
    auto list = [&](int c) {
      return c < C ? Top64{__ldcg(maxima + c * 64 + lane), __ldcg(maxima + c * 64 + 32 + lane)}
                   : Top64{kNegInf, kNegInf};
    };
    Top64 acc = list(warp), next = list(warp + kSplitWarps);  // both loads in flight at once
    for (int c = warp + kSplitWarps; c < C; c += kSplitWarps) {
      const Top64 now = next;
      next = list(c + kSplitWarps);
      acc = MergeTop64(acc, now);
    }
    merged[warp][lane] = acc.hi;
    merged[warp][32 + lane] = acc.lo;
  }
  // The union of the chunks' lists (at most C * SplitListCapacity(C) <= 2048), keys in
  // sh.cand_key and ids in sh.cum's storage (free until FinishCandidates).
  const int listed = row_listed;
  float* u_s = sh.cand_key;
  int* u_id = reinterpret_cast<int*>(sh.cum);
  int* survivors = u_id + kCandidateCapacity;
  // Four slots a thread per round, their loads issued before any is used (one L2 latency a
  // round instead of four; C <= 16 chunks is one round).
  constexpr int kLoadBatch = 4;
  const int64_t row_slots = static_cast<int64_t>(split_index) * C * kSplitMaxK;
  for (int base = 0; base < C * kSplitMaxK; base += kLoadBatch * kSplitThreads) {
    float xv[kLoadBatch];
    int idv[kLoadBatch], at[kLoadBatch];
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int e = base + b * kSplitThreads + threadIdx.x;
      const int c = e / kSplitMaxK, i = e % kSplitMaxK;
      at[b] = -1;
      if (e < C * kSplitMaxK && i < fs.list_count[c]) {
        at[b] = fs.list_base[c] + i;
        xv[b] = __ldcg(layout.cand_x + row_slots + e);
        idv[b] = __ldcg(layout.cand_id + row_slots + e);
      }
    }
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      if (at[b] >= 0) {
        u_s[at[b]] = xv[b] / T;  // s, as the CPU takes it
        u_id[at[b]] = idv[b];
      }
    }
  }
  if (threadIdx.x == 0) {
    fs.cut_prefix = 0;
    fs.cut_mask = 0;
    fs.cut_done = 0;
    fs.survived = 0;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    Top64 v[kSplitWarps];
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) v[w] = Top64{merged[w][lane], merged[w][32 + lane]};
    const Top64 t = MergeTop64(MergeTop64(MergeTop64(v[0], v[1]), MergeTop64(v[2], v[3])),
                               MergeTop64(MergeTop64(v[4], v[5]), MergeTop64(v[6], v[7])));
    const float kth = K <= 32 ? __shfl_sync(0xFFFFFFFFu, t.hi, K - 1) : __shfl_sync(0xFFFFFFFFu, t.lo, K - 33);
    if (lane == 0) fs.s_min = kth / T;
  }
  __syncthreads();
  // The survivors: the union's entries with s >= s_min, a superset of the row's top K (~K + 10
  // on normal logits, as a chunk's list). Where the bound leaves more than kSplitSurvivors
  // (ties, few distinct values), the radix narrowing below takes the whole union instead.
  {
    const float s_min = fs.s_min;
    for (int e = threadIdx.x; e < listed; e += blockDim.x) {
      if (u_s[e] >= s_min) {
        const int at = atomicAdd(&fs.survived, 1);
        if (at < kSplitSurvivors) survivors[at] = e;
      }
    }
  }
  __syncthreads();
  int n_survivors = fs.survived;
  if (n_survivors > kSplitSurvivors) {
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
    // key's top bits, so the comparison is the order's).
    if (threadIdx.x == 0) sh.count = 0;
    __syncthreads();
    {
      const uint32_t prefix = fs.cut_prefix, mask = fs.cut_mask;
      for (int e = threadIdx.x; e < listed; e += blockDim.x) {
        if ((OrderKey(u_s[e]) & mask) >= prefix) survivors[atomicAdd(&sh.count, 1)] = e;
      }
    }
    __syncthreads();
    n_survivors = sh.count;
  }
  // The survivors' ranks among themselves; the first K are the row's top K in order.
  RankAmong(
      n_survivors,
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

// The chunk's values live in registers: thread t's r-th value is token lo + ChunkColumn<G>(r),
// G consecutive tokens (one 16-byte load: G = 4 fp32 or 8 bf16 / fp16) from the groups t,
// t + 256, ...: coalesced, and an order that depends on V only. One read of the logits feeds
// the extremes, Z and the collection without a pass over shared memory.
constexpr int kChunkValues = kSplitChunk / kSplitThreads;  // 32 a thread
template <int G>
__device__ __forceinline__ int ChunkColumn(int r) {
  return G * (static_cast<int>(threadIdx.x) + kSplitThreads * (r / G)) + r % G;
}

// The most tokens a chunk lists unranked (their union must fit the finisher's candidates;
// SplitPathEligible keeps chunks * top_k <= kCandidateCapacity, so this is >= top_k).
__device__ __forceinline__ int SplitListCapacity(int chunks) {
  return min(kSplitMaxK, kCandidateCapacity / chunks);
}

// 2^v by the SFU alone (ex2.approx.ftz: relative error ~2^-22; results below 2^-126 flush to
// 0): exp2f adds a denormal rescaling around it, three more instructions a value for terms
// that cannot move Z at float32 precision.
__device__ __forceinline__ float Exp2Approx(float v) {
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(v));
  return out;
}

// One chunk of one split job: its tokens [lo, lo + n), where they are and its scratch slot.
struct SplitItem {
  int split_index, j, lo, n;
  const char* run;  // column lo's address (RowRun); null where the chunk straddles two shards
  int64_t slot;
  __device__ SplitItem(const StepParams& p, int split, int chunk, int chunks) : split_index(split) {
    j = p.split_jobs[split_index];
    lo = chunk * kSplitChunk;
    n = min(p.vocab_size, lo + kSplitChunk) - lo;
    run = RowRun(p, p.jobs[j].logits_row, lo, n);
    slot = static_cast<int64_t>(split_index) * chunks + chunk;
  }
};

// Loads tokens [lo, lo + n) of a job's row into x (tokens at or past n: -inf, never read) and
// admits them (LoadStats::Admit). All of a thread's loads are issued before the first is used.
template <int G>
__device__ __forceinline__ void LoadChunkValues(const StepParams& p, const RowJob& job, const char* run,
                                                int lo, int n, float (&x)[kChunkValues], LoadStats* st) {
  const bool vector = run != nullptr && reinterpret_cast<uintptr_t>(run) % 16 == 0;
  // A whole chunk (every chunk of a row but its last) takes no bounds checks, and a row with
  // no grammar mask no mask lookups: ~5 instructions a value against ~20 on the general way.
  const bool whole = n == kSplitChunk;
  constexpr int kElem = 16 / G;  // bytes a token
#pragma unroll
  for (int k = 0; k < kChunkValues / G; ++k) {
    const int c0 = ChunkColumn<G>(k * G);
    if (vector && (whole || c0 + G <= n)) {
      const char* at = run + static_cast<int64_t>(c0) * kElem;
      if (G == 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(at));
        x[k * G] = v.x;
        x[k * G + 1] = v.y;
        x[k * G + 2] = v.z;
        x[k * G + 3] = v.w;
      } else {
        float out[8];
        Unpack16(__ldg(reinterpret_cast<const uint4*>(at)), p.dtype, out);
#pragma unroll
        for (int w = 0; w < G; ++w) x[k * G + w] = out[w];
      }
    } else {
#pragma unroll
      for (int w = 0; w < G; ++w) {
        x[k * G + w] = c0 + w >= n         ? kNegInf
                       : run != nullptr ? LoadLogit(run, p.dtype, c0 + w)
                                        : LoadLogitAt(p, job.logits_row, lo + c0 + w);
      }
    }
  }
  const unsigned char* mask = RowMask(job);
  if (mask == nullptr) {
    // The row's last chunk too: its tokens past n hold -inf, which AdmitUnmasked takes as
    // Admit takes a banned token (no fault, no extreme), so it need not test c < n per value.
    st->AdmitUnmasked(x);
  } else {
#pragma unroll
    for (int r = 0; r < kChunkValues; ++r) {
      const int c = ChunkColumn<G>(r);
      if (c < n) x[r] = st->Admit(x[r], mask, lo + c);
    }
  }
}

// The job's token updates that fall in the chunk, on register-resident values: through the
// chunk's shared memory (ApplyChunkUpdates), and back with the extremes taken again where an
// update fell in the chunk. (Applying them in registers, each by the thread holding its token,
// measured slower: +21% against +0% at R = 16 with gpu_bench's adjustments. So did issue 34's
// version in which the block first lists the chunk's updates in shared memory and each token's
// thread then applies it in registers: +25.8% at R = 16 and +31.6% at R = 384 decode, against
// -3.4% and +12.4% for this one in the same session; and a barrier-free one, each warp taking
// the chunk's updates by a ballot over the row's: +12.0% and +30.4%. Applying an update to a
// value chosen at run time among the 32 a thread holds makes ptxas spill under the 64-register
// cap: 180 bytes of spill stores against 24 here (-Xptxas -v). Its second session tried the
// ballot version again with a select over the 32 values instead of a run-time index: 44 bytes
// of spill stores and 236 of loads, and the load stage at R = 16 with adjustments took 5.1 us
// instead of 1.1, +37.5% against the same step without them. Its third session measured two
// more, neither faster at decode R = 384 with adjustments: the copy replaced by sparse results
// in xs and a bit per (thread, value) in a word per thread, each thread taking its own by
// compile-time index, 198.8 / 198.5 us against 197.6 / 198.1; the thread's first update
// fetched into shared memory by cp.async beside the chunk's loads, 202.5 / 202.1 against
// 197.0 / 198.6: neither the copy nor the updates' L2 latency is what the adjustments cost.)
template <int G>
__device__ void UpdateChunkValues(const StepParams& p, const RowJob& job, int lo, int n, float* xs,
                                  float (&x)[kChunkValues], LoadStats* st) {
#pragma unroll
  for (int k = 0; k < kChunkValues / G; ++k) {
#pragma unroll
    for (int h = 0; h < G; h += 4) {
      *reinterpret_cast<float4*>(xs + ChunkColumn<G>(k * G) + h) =
          make_float4(x[k * G + h], x[k * G + h + 1], x[k * G + h + 2], x[k * G + h + 3]);
    }
  }
  __syncthreads();
  if (__syncthreads_or(ApplyChunkUpdates(p, job, lo, n, xs, st))) {
    st->RestartExtremes();
#pragma unroll
    for (int r = 0; r < kChunkValues; ++r) {
      x[r] = xs[ChunkColumn<G>(r)];
      st->Extremes(x[r]);
    }
  }
}

// A chunk block (and, if it is its row's last, the row's finisher). Barriers: S1 publishes
// each warp's extremes and its sorted thread maxima; S2 the chunk's threshold; S3 the
// collected tokens. (A persistent grid looping over chunks, fetching the next one by cp.async
// while working on the current, measured slower: 334 against 236 us at R = 384, the rows'
// finishes landing unevenly on the blocks. So did each block warming the chunk 4 x SMs blocks
// further on into L2 with a bulk prefetch: 188.2 against 163.9 us at R = 384 prefill fp32,
// 3,494 against 2,956 at R = 8192, the load stage 4.3 -> 6.0 us. So did a resident grid taking
// chunks from an atomic work queue, the next chunk by cp.async into the staging buffer: 180.9
// against 162.0 us at R = 384 prefill (2,834 against 2,955 at R = 8192), the loop's state
// spilling the chunk's registers; gpu-notes, issue 34's fourth session.)
template <int G>
__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSm) SplitRowKernel(StepParams p) {
  __shared__ __align__(16) SplitSmem smem;
  __shared__ float warp_m[kSplitWarps], warp_mn[kSplitWarps], warp_z[kSplitWarps];
  __shared__ int warp_bad[kSplitWarps];
  __shared__ float sorted_max[kSplitWarps][32];  // each warp's thread maxima, descending
  __shared__ int collected;
  __shared__ float threshold;
  __shared__ int last;
  float* const coll_x = smem.chunk.coll_x;
  int* const coll_id = smem.chunk.coll_id;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const SplitLayout layout(p);
  const SplitItem it(p, blockIdx.y, blockIdx.x, layout.chunks);
  const RowJob job = p.jobs[it.j];
  // Benchmarks: %globaltimer at stage ends of split job 0's chunk 0 (stage_times[9..14]).
  const bool timed = ProbeTimes() != nullptr && it.slot == 0;
  auto stage = [&](int k) {
    if (timed && threadIdx.x == 0) ProbeTimes()[k] = GlobalTimer();
  };
  stage(9);
  if (threadIdx.x == 0) collected = 0;
  float x[kChunkValues];
  LoadStats st;
  LoadChunkValues<G>(p, job, it.run, it.lo, it.n, x, &st);
  if (job.update_end > job.update_begin) UpdateChunkValues<G>(p, job, it.lo, it.n, smem.chunk.xs, x, &st);
  stage(10);
  const float T = job.temperature;
  const int K = job.top_k;
  // Each warp's extremes and faults, and its 32 thread maxima sorted descending (bitonic, in
  // registers): the chunk's threshold below is the K-th largest thread maximum.
  {
    float m = st.m, mn = st.mn;
    int bad = st.bad;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
      mn = fminf(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, o));
      bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, o);
    }
    sorted_max[warp][lane] = BitonicSortDesc32(st.m);
    if (lane == 0) {
      warp_m[warp] = m;
      warp_mn[warp] = mn;
      warp_bad[warp] = bad;
    }
  }
  __syncthreads();  // S1
  stage(11);
  float m = warp_m[0], mn = warp_mn[0];
  int bad = warp_bad[0];
#pragma unroll
  for (int w = 1; w < kSplitWarps; ++w) {
    m = fmaxf(m, warp_m[w]);
    mn = fminf(mn, warp_mn[w]);
    bad |= warp_bad[w];
  }
  // The threshold: the K-th largest of the block's 256 thread maxima. The K threads holding
  // the largest each hold a token >= it, so the chunk has at least K tokens >= it, and
  // (division by T being monotone) every token of the chunk's top K by (s desc, id asc) has
  // s >= it / T. Warp 0 merges the eight warps' sorted lists in registers, keeping the largest
  // 64 (K <= kSplitMaxK), while the others sum Z. (Ranking every entry by binary search in
  // the other warps' lists took 29% of the kernel's instructions in ncu; this is ~250 a chunk.)
  static_assert(kSplitWarps == 8 && kSplitMaxK <= 64, "the merge tree takes 8 lists and keeps 64");
  if (warp == 0) {
    float v[kSplitWarps];
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) v[w] = sorted_max[w][lane];
    const Top64 t = MergeTop64(MergeTop64(Merge32(v[0], v[1]), Merge32(v[2], v[3])),
                               MergeTop64(Merge32(v[4], v[5]), Merge32(v[6], v[7])));
    const float kth = K <= 32 ? __shfl_sync(0xFFFFFFFFu, t.hi, K - 1) : __shfl_sync(0xFFFFFFFFu, t.lo, K - 33);
    if (lane == 0) threshold = kth;
    layout.maxima[it.slot * 64 + lane] = t.hi;  // for the finisher's bound
    layout.maxima[it.slot * 64 + 32 + lane] = t.lo;
  }
  // Z's partial (exp2 of x * log2(e) / T: Z only feeds top-p and the logprobs' normaliser,
  // within the CPU's 1e-5 tolerance): each thread's values in order, then a fixed tree.
  const float scale = Log2eOverT(T);
  {
    float z = 0.0f;
    if (m != kNegInf) {
#pragma unroll
      for (int r = 0; r < kChunkValues; ++r) z += Exp2Approx((x[r] - m) * scale);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xFFFFFFFFu, z, o);
    if (lane == 0) warp_z[warp] = z;
  }
  __syncthreads();  // S2
  stage(12);
  // The tokens listed: x >= x_lo, a margin below the threshold that every x with
  // x / T >= threshold / T (both rounded, the latter a normal float) clears. The few it adds
  // (x just under the threshold) are tokens of the row like any other: the finisher ranks the
  // union by s = x / T, so a superset of the chunk's top K loses nothing, and no division is
  // needed here.
  // (Threshold -inf: fewer than K threads hold a finite token; every finite token is listed.)
  const float t_x = threshold;
  auto collect = [&](int r) {
    const int at = atomicAdd(&collected, 1);  // slots in any order: the finisher ranks
    if (at < kSplitCapacity) {
      coll_x[at] = x[r];
      coll_id[at] = it.lo + ChunkColumn<G>(r);
    }
  };
  const float s_min = t_x / T;
  if (t_x == kNegInf || fabsf(s_min) >= FLT_MIN) {
    const float x_lo = t_x == kNegInf ? -FLT_MAX : t_x - fabsf(t_x) * 0x1.0p-20f - 1e-30f;
#pragma unroll
    for (int r = 0; r < kChunkValues; ++r) {
      if (x[r] >= x_lo) collect(r);
    }
  } else {
    // The threshold's score is subnormal or zero (a huge T, or T = +inf: every finite x / T
    // is +-0): distant x can share a score there, so the margin above does not hold. Each
    // token by its exact score instead (block-uniform; with T = +inf every finite token, so
    // the chunk overflows and the row runs the general algorithm).
#pragma unroll
    for (int r = 0; r < kChunkValues; ++r) {
      if (x[r] != kNegInf && x[r] / T >= s_min) collect(r);
    }
  }
  __syncthreads();  // S3
  stage(13);
  const int nc = collected;
  int count;
  if (nc > kSplitCapacity) {
    count = -1;  // a flat chunk: the finisher runs the general algorithm on the row
  } else if (nc <= SplitListCapacity(layout.chunks)) {
    // The usual case: the collected tokens as they are (the finisher ranks the union).
    for (int i = threadIdx.x; i < nc; i += kSplitThreads) {
      layout.cand_x[it.slot * kSplitMaxK + i] = coll_x[i];
      layout.cand_id[it.slot * kSplitMaxK + i] = coll_id[i];
    }
    count = nc;
  } else {
    // More than the list holds: the chunk's top K, by each one's rank among the collected.
    RankAmong(
        nc,
        [&](int a, float* sa, int* ia) {
          *sa = coll_x[a] / T;
          *ia = coll_id[a];
        },
        [&](int a, int r) {
          if (r < K) {
            layout.cand_x[it.slot * kSplitMaxK + r] = coll_x[a];
            layout.cand_id[it.slot * kSplitMaxK + r] = coll_id[a];
          }
        });
    count = K;
  }
  if (threadIdx.x == 0) {
    float z = warp_z[0];
    for (int w = 1; w < kSplitWarps; ++w) z += warp_z[w];
    layout.partials[it.slot] = SplitPartial{m, mn, z, bad, count};
  }
  stage(14);
  // Arrival: every thread's writes reach the device before thread 0 counts this chunk in
  // (the threadfence-reduction pattern); the row's last arrival finishes it and re-arms the
  // counter for the next launch.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&p.split_arrivals[it.split_index], 1u) ==
           static_cast<unsigned int>(layout.chunks - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) p.split_arrivals[it.split_index] = 0;
  SplitFinishRow(p, it.split_index, smem.finish);
}

}  // namespace detail

size_t SplitScratchBytes(int32_t num_split, int32_t vocab_size) {
  const size_t slots =
      static_cast<size_t>(num_split) * ((vocab_size + kSplitChunk - 1) / kSplitChunk);
  return slots * (sizeof(detail::SplitPartial) + kSplitMaxK * (sizeof(float) + sizeof(int32_t)) +
                  64 * sizeof(float));
}

LaunchConfig SplitRowsConfig(const StepParams& params) {
  return LaunchConfig{"SplitRowKernel",
                      dim3((params.vocab_size + kSplitChunk - 1) / kSplitChunk, params.num_split),
                      dim3(detail::kSplitThreads), 0};
}

cudaError_t LaunchSplitRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_split == 0) return cudaSuccess;
  const LaunchConfig config = SplitRowsConfig(params);
  if (params.dtype == DType::kFloat32) {
    detail::SplitRowKernel<4><<<config.grid, config.block, 0, stream>>>(params);
  } else {
    detail::SplitRowKernel<8><<<config.grid, config.block, 0, stream>>>(params);
  }
  return cudaGetLastError();
}

// This translation unit's copy of the stage probe (general_path.cu's SetStageProbe sets
// every copy).
cudaError_t SetStageProbeSplit(const StageProbe& probe) {
  return detail::SetThisUnitsStageProbe(probe);
}

}  // namespace cuda
}  // namespace samplerd
