// The split path's finish (private to cuda/, included by split_path.cu): what the last chunk
// block of a row does with its row's chunk partials and lists, stage by stage. split_path.cu
// holds the chunk stage (one read of a chunk into registers) and the launch.
//
//   CombinePartials    warp 0: extremes, faults, Z and each chunk list's place in the union
//   MergeChunkMaxima   every warp: the chunks' 64 largest thread maxima merged (a K-th bound)
//   GatherUnion        the chunks' lists into one union in shared memory (s = x / T)
//   KthBound           warp 0: the bound's score s_min (at least K tokens have s >= it)
//   SelectSurvivors    the union's entries that may be in the row's top K (<= kSplitSurvivors)
//   RankTopK           their ranks; the first K, in order, are the row's candidates
// then FinishCandidates (kernels/finish.cuh), as the fused path's candidates finish.
#ifndef SAMPLERD_CUDA_KERNELS_SPLIT_FINISH_CUH_
#define SAMPLERD_CUDA_KERNELS_SPLIT_FINISH_CUH_

#include "cuda/kernels/general.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

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
  SplitLayout() = default;  // trivial: a streaming block holds one in shared memory
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

struct SplitFinishSmem {
  Shared sh;
  int list_base[kSplitMaxChunks];   // each chunk's list in the union
  int list_count[kSplitMaxChunks];
  uint32_t cut_prefix, cut_mask;    // the radix narrowing's state
  int cut_digit, cut_done;
  float s_min;                      // the bound's score (SplitFinishRow)
  int survived;
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

// What CombinePartials leaves for the row, in shared memory.
struct SplitRowSummary {
  float x_max, x_min;
  double z;
  int bad, flat, listed;
};

// Warp 0 combines the partials, chunk c in lane c % 32 (C <= 64): extremes, faults, each
// list's place in the union (fs.list_base, fs.list_count), and Z = sum over chunks of
// z_c * exp2((max_c - max) * log2(e) / T) in double, by a fixed shuffle tree (C only).
__device__ __forceinline__ void CombinePartials(const SplitPartial* parts, int C, float T,
                                                SplitFinishSmem& fs, SplitRowSummary& row) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
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
  if (lane == 0) row = SplitRowSummary{x_max, x_min, z, bad, flat, listed};
}

// A bound on the row's K-th largest x: the K-th largest of the chunks' thread maxima, from
// each chunk's 64 largest (K <= 64; they are x of distinct tokens, so at least K tokens have
// x >= it, and the row's K-th largest s is >= its score s_min: rounding x / T is monotone).
// Every warp merges the lists of chunks warp, warp + 8, .. into merged[warp]; KthBound merges
// the eight.
__device__ __forceinline__ void MergeChunkMaxima(const SplitLayout& layout, int split_index,
                                                 float (*merged)[64]) {
  const int C = layout.chunks, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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

// Warp 0, after MergeChunkMaxima's writes: fs.s_min, the K-th largest of the merged maxima / T.
__device__ __forceinline__ void KthBound(float (*merged)[64], int K, float T, SplitFinishSmem& fs) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  Top64 v[kSplitWarps];
#pragma unroll
  for (int w = 0; w < kSplitWarps; ++w) v[w] = Top64{merged[w][lane], merged[w][32 + lane]};
  const Top64 t = MergeTop64(MergeTop64(MergeTop64(v[0], v[1]), MergeTop64(v[2], v[3])),
                             MergeTop64(MergeTop64(v[4], v[5]), MergeTop64(v[6], v[7])));
  const float kth = K <= 32 ? __shfl_sync(0xFFFFFFFFu, t.hi, K - 1) : __shfl_sync(0xFFFFFFFFu, t.lo, K - 33);
  if (lane == 0) fs.s_min = kth / T;
}

// The union of the chunks' lists (at most C * SplitListCapacity(C) <= 2048): scores s = x / T
// (as the CPU takes them) in u_s, ids in u_id, each list at its fs.list_base. Four slots a
// thread per round, their loads issued before any is used (one L2 latency a round instead of
// four; C <= 16 chunks is one round).
__device__ __forceinline__ void GatherUnion(const SplitLayout& layout, int split_index, float T,
                                            const SplitFinishSmem& fs, float* u_s, int* u_id) {
  const int C = layout.chunks;
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
        u_s[at[b]] = xv[b] / T;
        u_id[at[b]] = idv[b];
      }
    }
  }
}

// The survivors (indices into the union): its entries with s >= fs.s_min, a superset of the
// row's top K (~K + 10 on normal logits, as a chunk's list). Where the bound leaves more than
// kSplitSurvivors (ties, few distinct values), a radix narrowing of the whole union instead.
// Returns how many; every thread calls it (it synchronises the block).
__device__ __forceinline__ int SelectSurvivors(SplitFinishSmem& fs, int listed, int K,
                                               const float* u_s, int* survivors) {
  Shared& sh = fs.sh;
  const int lane = threadIdx.x & 31;
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
  if (n_survivors <= kSplitSurvivors) return n_survivors;
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
  return n_survivors;
}

// The survivors' ranks among themselves; the first K, in order, go to sh.cand_s / sh.cand_id.
__device__ __forceinline__ void RankTopK(Shared& sh, const float* u_s, const int* u_id,
                                         const int* survivors, int n_survivors, int K) {
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
}

// The last chunk block of a row finishes it: the stages above, then FinishCandidates; a
// faulty row gets its status; a flat one (a chunk overflowed its list) the same finish from its
// top K by a radix selection over the whole row.
static __device__ __noinline__ void SplitFinishRow(const StepParams& p, int split_index, SplitFinishSmem& fs) {
  __shared__ SplitRowSummary row;
  Shared& sh = fs.sh;
  const int j = p.split_jobs[split_index];
  const RowJob job = p.jobs[j];
  RowResult& out = p.results[j];
  const int V = p.vocab_size;
  const SplitLayout layout(p);
  const int C = layout.chunks;
  const float T = job.temperature;
  const int K = job.top_k;
  const bool timed = ProbeTimes() != nullptr && split_index == 0;  // stage_times[15..17]
  auto stage = [&](int k) {
    if (timed && threadIdx.x == 0) ProbeTimes()[k] = GlobalTimer();
  };
  stage(15);
  CombinePartials(layout.partials + static_cast<int64_t>(split_index) * C, C, T, fs, row);
  __syncthreads();
  const float x_max = row.x_max;
  const int32_t fault = RowFault(row.bad, row.x_min, x_max, T, /*check_temperature=*/true);
  if (fault != 0) {
    if (threadIdx.x == 0) out.status = fault;
    return;
  }
  if (row.flat) {
    // A flat row (a chunk listed more than kSplitCapacity tokens): x into the workspace (steps
    // 1-3 again), the row's top K by a radix selection over it, then the same finish as any
    // other row, from the same partials. What a row answers is a function of its top K and its
    // partials alone, not of which chunks overflowed their lists: a chunk stage that lists
    // differently (issue 49's branch issue49-light-stage lists later chunks against a bound
    // from earlier ones) cannot change it (SPEC 8, batch invariance).
    float* const x = p.workspace + static_cast<int64_t>(j) * V;
    {
      int bad;
      float m, mn;
      LoadChunk(p, job, 0, V, x, &bad, &m, &mn);
    }
    __syncthreads();
    // The scores as ScoresOf gives them: -inf stays -inf (with T = +inf, -inf / T is NaN), and
    // a finite x / T cannot overflow (RowFault failed such rows above).
    SelectTopKCut(sh, V, K, [&](int c) {
      const float v = x[c];
      return v == kNegInf ? kNegInf : v / T;
    });
    const bool cut = sh.sel_id >= 0;  // else fewer than K finite tokens: all of them
    const uint32_t cut_key = sh.sel_key;
    const int cut_id = sh.sel_id;
    __syncthreads();
    if (threadIdx.x == 0) sh.count = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      const float v = x[c];
      if (v == kNegInf) continue;
      const float s = v / T;
      if (!cut || AtOrBefore(OrderKey(s), c, cut_key, cut_id)) {
        const int at = atomicAdd(&sh.count, 1);  // exactly min(K, finite) <= kCandidateCapacity
        sh.cand_id[at] = c;
        sh.cand_s[at] = s;
      }
    }
    __syncthreads();
    const int n_cand = sh.count;
    __syncthreads();
    stage(16);
    FinishCandidates(sh, job, out, V, x_max / T, row.z, n_cand, /*sorted=*/false);
    __syncthreads();
    stage(17);
    return;
  }
  static_assert(kSplitWarps * 64 * sizeof(float) <= sizeof(sh.hist_mass), "merge space");
  float(*merged)[64] = reinterpret_cast<float(*)[64]>(sh.hist_mass);  // free until the finish
  MergeChunkMaxima(layout, split_index, merged);
  // The union in sh.cand_key and sh.cum's storage (free until FinishCandidates).
  const int listed = row.listed;
  float* u_s = sh.cand_key;
  int* u_id = reinterpret_cast<int*>(sh.cum);
  int* survivors = u_id + kCandidateCapacity;
  GatherUnion(layout, split_index, T, fs, u_s, u_id);
  if (threadIdx.x == 0) {
    fs.cut_prefix = 0;
    fs.cut_mask = 0;
    fs.cut_done = 0;
    fs.survived = 0;
  }
  __syncthreads();
  KthBound(merged, K, T, fs);
  __syncthreads();
  const int n_survivors = SelectSurvivors(fs, listed, K, u_s, survivors);
  RankTopK(sh, u_s, u_id, survivors, n_survivors, K);
  __syncthreads();
  const int n_cand = min(listed, K);
  stage(16);
  FinishCandidates(sh, job, out, V, x_max / T, row.z, n_cand, /*sorted=*/true);
  __syncthreads();
  stage(17);
}

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_KERNELS_SPLIT_FINISH_CUH_
