// The split path, for rows with a small top-k: independent blocks over chunks of each row,
// the last of which finishes the row.
#include <cfloat>
#include <cmath>
#include <utility>

#include "cuda/kernels/split_finish.cuh"

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
// the row, and the finishing block takes the row's top K from the whole row instead. Chunks, their
// order and every reduction depend on V only.

// The most tokens a chunk lists unranked (their union must fit the finisher's candidates;
// SplitPathEligible keeps chunks * top_k <= kCandidateCapacity, so this is >= top_k).
// (Computed in place: held in SplitLayout from the kernel's start, it cost the chunk blocks
// 24 more bytes of spill stores.)
__device__ __forceinline__ int SplitListCapacity(int chunks) {
  return min(kSplitMaxK, kCandidateCapacity / chunks);
}

// A block is a chunk first and, if it is its row's last, the row's finisher: the two phases
// share one piece of shared memory.
struct SplitChunkSmem {
  __align__(16) float xs[kSplitChunk];  // the chunk, only to apply its token updates
  float coll_x[kSplitCapacity];
  int coll_id[kSplitCapacity];
};
union SplitSmem {
  SplitChunkSmem chunk;
  SplitFinishSmem finish;
};

// The chunk's values live in registers: thread t's r-th value is token lo + ChunkColumn<G>(r),
// G consecutive tokens (one 16-byte load: G = 4 fp32 or 8 bf16 / fp16) from the groups t,
// t + 256, ...: coalesced, and an order that depends on V only. One read of the logits feeds
// the extremes, Z and the collection without a pass over shared memory.
constexpr int kChunkValues = kSplitChunk / kSplitThreads;  // 32 a thread
template <int G>
__device__ __forceinline__ int ChunkColumn(int r) {
  return G * (static_cast<int>(threadIdx.x) + kSplitThreads * (r / G)) + r % G;
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
  __device__ SplitItem(const StepParams& p, int split, int chunk, int chunks)
      : SplitItem(p, split, p.split_jobs[split], p.jobs[p.split_jobs[split]].logits_row, chunk,
                  chunks) {}
  // The same, from the row's job index j and logits row, and `row`, column 0's address where
  // the whole row is one run (else null): a streaming block holds them, so that each chunk does
  // not start with dependent loads of the job, its row and the logits' layout.
  __device__ SplitItem(const StepParams& p, int split, int job_index, int32_t logits_row, int chunk,
                       int chunks, const char* row = nullptr)
      : split_index(split), j(job_index) {
    lo = chunk * kSplitChunk;
    n = min(p.vocab_size, lo + kSplitChunk) - lo;
    run = row != nullptr ? row + static_cast<int64_t>(lo) * LogitBytes(p.dtype)
                         : RowRun(p, logits_row, lo, n);
    slot = static_cast<int64_t>(split_index) * chunks + chunk;
  }
};

// Loads tokens [lo, lo + n) of a job's row into x (tokens at or past n: -inf, never read) and
// admits them (LoadStats::Admit). All of a thread's loads are issued before the first is used.
// Group k of a thread's values (G tokens) from one 16-byte load at `at`.
// (`kShared`: from the staging buffer in shared memory rather than from the logits.)
template <int G, bool kShared = false>
__device__ __forceinline__ void LoadGroup(const char* at, DType dtype, int k, float (&x)[kChunkValues]) {
  if (G == 4) {
    const float4 v = kShared ? *reinterpret_cast<const float4*>(at)
                             : __ldg(reinterpret_cast<const float4*>(at));
    x[k * G] = v.x;
    x[k * G + 1] = v.y;
    x[k * G + 2] = v.z;
    x[k * G + 3] = v.w;
  } else {
    float out[8];
    Unpack16(kShared ? *reinterpret_cast<const uint4*>(at) : __ldg(reinterpret_cast<const uint4*>(at)),
             dtype, out);
#pragma unroll
    for (int w = 0; w < G; ++w) x[k * G + w] = out[w];
  }
}

template <int G>
__device__ __forceinline__ void LoadChunkValues(const StepParams& p, const RowJob& job, const char* run,
                                                int lo, int n, float (&x)[kChunkValues], LoadStats* st,
                                                const char* staged) {
  constexpr int kElem = 16 / G;  // bytes a token
  if (staged != nullptr) {
    // A whole chunk already in shared memory (StageChunk): each thread reads its own groups.
#pragma unroll
    for (int k = 0; k < kChunkValues / G; ++k) {
      LoadGroup<G, true>(staged + static_cast<int64_t>(ChunkColumn<G>(k * G)) * kElem, p.dtype, k, x);
    }
  } else if (run != nullptr) {
    const bool vector = reinterpret_cast<uintptr_t>(run) % 16 == 0;
    // A whole chunk (every chunk of a row but its last) takes no bounds checks, and a row with
    // no grammar mask no mask lookups: ~5 instructions a value against ~20 on the general way.
    const bool whole = n == kSplitChunk;
#pragma unroll
    for (int k = 0; k < kChunkValues / G; ++k) {
      const int c0 = ChunkColumn<G>(k * G);
      if (vector && (whole || c0 + G <= n)) {
        LoadGroup<G>(run + static_cast<int64_t>(c0) * kElem, p.dtype, k, x);
      } else {
#pragma unroll
        for (int w = 0; w < G; ++w) x[k * G + w] = c0 + w < n ? LoadLogit(run, p.dtype, c0 + w) : kNegInf;
      }
    }
  } else {
    // The chunk straddles tensor-parallel shards: a group inside one shard at a 16-byte
    // aligned address is still one load; the group across a boundary is read value by value.
    ShardWalker walk(p, job.logits_row, lo + ChunkColumn<G>(0));
#pragma unroll
    for (int k = 0; k < kChunkValues / G; ++k) {
      const int c0 = ChunkColumn<G>(k * G);
      const char* at = c0 < n ? walk.At(lo + c0) : nullptr;
      if (at != nullptr && c0 + G <= n && lo + c0 + G <= walk.end() &&
          reinterpret_cast<uintptr_t>(at) % 16 == 0) {
        LoadGroup<G>(at, p.dtype, k, x);
      } else {
#pragma unroll
        for (int w = 0; w < G; ++w) {
          x[k * G + w] = c0 + w < n ? LoadLogit(walk.At(lo + c0 + w), p.dtype, 0) : kNegInf;
        }
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
// 197.0 / 198.6: neither the copy nor the updates' L2 latency is what the adjustments cost.
// Issue 49's sixth session timed a streaming chunk's stages: with adjustments its load stage
// took 2.8 us against 0.7, a row with updates then loading each chunk from HBM, unstaged.)
// kStaging: the block stages its chunks through xs (the streaming kernel), the next chunk's
// copy issued once this returns. For bf16 / fp16 a thread's values in xs (floats) are not the
// bytes it staged (16-bit), so barriers keep the copy in and out of other threads' staging.
template <int G, bool kStaging>
__device__ void UpdateChunkValues(const StepParams& p, const RowJob& job, int lo, int n, float* xs,
                                  float (&x)[kChunkValues], LoadStats* st) {
  constexpr bool kForeign = kStaging && G != 4;  // a thread's floats overlap others' staging
  if (kForeign) __syncthreads();  // every thread has read its staged groups
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
    if (kForeign) __syncthreads();  // every thread has read its values back
  }
}

// The chunk stage's shared state: a chunk block's, or a streaming block's for each of its row's
// chunks in turn.
struct SplitChunkShared {
  float warp_m[kSplitWarps], warp_mn[kSplitWarps], warp_z[kSplitWarps];
  int warp_bad[kSplitWarps];
  float sorted_max[kSplitWarps][32];  // each warp's thread maxima, descending
  // Tokens collected, by the chunk's parity: a streaming block's thread 0 zeroes the next
  // chunk's count while other threads may still read this one's (no barrier between chunks).
  int collected[2];
  float threshold;
};

// One chunk of a split job, its values already in x (LoadChunkValues; token updates applied):
// the chunk's threshold, Z partial and list into its scratch slot. Barriers: S1 publishes each
// warp's extremes and its sorted thread maxima; S2 the chunk's threshold; S3 the collected
// tokens. Every thread calls it; cs.collected[parity] is zero on entry. `stamps`: benchmarks'
// (ProbeChunkTimes), null in production.
// (Issue 49's second session measured two changes here, both slower on the H100 and reverted:
// Z's partial before S1 against each warp's own max, so that warp 0's merge tree alone lies
// between S1 and S2 (R = 1's chunk stage 4.8 -> 6.3 us with the next one); and the collection
// a ballot a value, one shared atomic a warp where any lane lists it, instead of a divergent
// branch and an atomic a listed token: 3.8% more instructions, the collect stage 1.1 -> 2.6 us,
// each listed value's atomic, shuffle and stores a chain that the next one waits for.)
template <int G>
__device__ __forceinline__ void SplitChunkStage(const StepParams& p, const SplitLayout& layout,
                                                const SplitItem& it, const RowJob& job,
                                                const LoadStats& st, const float (&x)[kChunkValues],
                                                SplitSmem& smem, SplitChunkShared& cs,
                                                int parity, unsigned long long* stamps) {
  auto stage = [&](int k) {
    if (stamps != nullptr && threadIdx.x == 0) stamps[k] = GlobalTimer();
  };
  float* const coll_x = smem.chunk.coll_x;
  int* const coll_id = smem.chunk.coll_id;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
    cs.sorted_max[warp][lane] = BitonicSortDesc32(st.m);
    if (lane == 0) {
      cs.warp_m[warp] = m;
      cs.warp_mn[warp] = mn;
      cs.warp_bad[warp] = bad;
    }
  }
  __syncthreads();  // S1
  stage(3);
  float m = cs.warp_m[0], mn = cs.warp_mn[0];
  int bad = cs.warp_bad[0];
#pragma unroll
  for (int w = 1; w < kSplitWarps; ++w) {
    m = fmaxf(m, cs.warp_m[w]);
    mn = fminf(mn, cs.warp_mn[w]);
    bad |= cs.warp_bad[w];
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
    for (int w = 0; w < kSplitWarps; ++w) v[w] = cs.sorted_max[w][lane];
    const Top64 t = MergeTop64(MergeTop64(Merge32(v[0], v[1]), Merge32(v[2], v[3])),
                               MergeTop64(Merge32(v[4], v[5]), Merge32(v[6], v[7])));
    const float kth = K <= 32 ? __shfl_sync(0xFFFFFFFFu, t.hi, K - 1) : __shfl_sync(0xFFFFFFFFu, t.lo, K - 33);
    if (lane == 0) cs.threshold = kth;
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
    if (lane == 0) cs.warp_z[warp] = z;
  }
  __syncthreads();  // S2
  stage(4);
  // The tokens listed: x >= x_lo, a margin below the threshold that every x with
  // x / T >= threshold / T (both rounded, the latter a normal float) clears. The few it adds
  // (x just under the threshold) are tokens of the row like any other: the finisher ranks the
  // union by s = x / T, so a superset of the chunk's top K loses nothing, and no division is
  // needed here.
  // (Threshold -inf: fewer than K threads hold a finite token; every finite token is listed.)
  const float t_x = cs.threshold;
  // (Issue 49's third session measured the collection as a word of bits, FSETP / SEL / IADD a
  // value and one atomic a thread for all its slots, instead of this branch a value and atomic
  // a listed token: the loop over the bits needs a value by run-time index, and a copy of x in
  // local memory for it made prefill R = 384 197.5 us against 146.6 and R = 8,192 4,155
  // against 2,205, the local stores leaving through L1 to HBM; docs/gpu-notes.md.)
  auto collect = [&](int r) {
    const int at = atomicAdd(&cs.collected[parity], 1);  // slots in any order: the finisher ranks
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
    // the chunk overflows and the finisher selects from the whole row).
#pragma unroll
    for (int r = 0; r < kChunkValues; ++r) {
      if (x[r] != kNegInf && x[r] / T >= s_min) collect(r);
    }
  }
  __syncthreads();  // S3
  stage(5);
  const int nc = cs.collected[parity];
  int count;
  if (nc > kSplitCapacity) {
    count = -1;  // a flat chunk: the finisher takes the row's top K from the whole row
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
    float z = cs.warp_z[0];
    for (int w = 1; w < kSplitWarps; ++w) z += cs.warp_z[w];
    layout.partials[it.slot] = SplitPartial{m, mn, z, bad, count};
  }
  stage(6);
}

// One chunk `it` of a split job, whole: its values loaded into registers (from `staged`, the
// staging buffer in shared memory, where it holds the chunk), the job's token updates,
// `after_load()` (the streaming kernel, kStaging, starts its next chunk's copy there, once no
// thread reads staging or applies updates there any more), then the chunk stage (its count in
// cs.collected[parity]). Both split kernels take every chunk through it.
template <int G, bool kStaging, typename AfterLoad>
__device__ __forceinline__ void SplitChunk(const StepParams& p, const SplitLayout& layout,
                                           const SplitItem& it, const RowJob& job,
                                           const char* staged, SplitSmem& smem,
                                           SplitChunkShared& cs, int parity, AfterLoad after_load) {
  // Benchmarks: %globaltimer at stage ends of split job 0's first chunks (ProbeChunkTimes).
  unsigned long long* const stamps = it.split_index == 0 ? ProbeChunkTimes(it.lo / kSplitChunk) : nullptr;
  if (stamps != nullptr && threadIdx.x == 0) stamps[0] = GlobalTimer();
  if (threadIdx.x == 0) cs.collected[parity] = 0;
  float x[kChunkValues];
  LoadStats st;
  if (staged) asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  if (stamps != nullptr && threadIdx.x == 0) stamps[1] = GlobalTimer();
  LoadChunkValues<G>(p, job, it.run, it.lo, it.n, x, &st, staged);
  if (job.update_end > job.update_begin) {
    UpdateChunkValues<G, kStaging>(p, job, it.lo, it.n, smem.chunk.xs, x, &st);
  }
  after_load();
  if (stamps != nullptr && threadIdx.x == 0) stamps[2] = GlobalTimer();
  SplitChunkStage<G>(p, layout, it, job, st, x, smem, cs, parity, stamps);
}

// A chunk block (and, if it is its row's last, the row's finisher).
// (A persistent grid looping over chunks, fetching the next one by cp.async while working on
// the current, measured slower: 334 against 236 us at R = 384, the rows' finishes landing
// unevenly on the blocks. So did each block warming the chunk 4 x SMs blocks further on into
// L2 with a bulk prefetch: 188.2 against 163.9 us at R = 384 prefill fp32, 3,494 against 2,956
// at R = 8192, the load stage 4.3 -> 6.0 us. So did a resident grid taking chunks from an
// atomic work queue, the next chunk by cp.async into the staging buffer: 180.9 against 162.0
// us at R = 384 prefill (2,834 against 2,955 at R = 8192), the loop's state spilling the
// chunk's registers; gpu-notes, issue 34's fourth session.)
template <int G>
__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSm) SplitRowKernel(const __grid_constant__ StepParams p) {
  __shared__ __align__(16) SplitSmem smem;
  __shared__ SplitChunkShared cs;
  __shared__ int last;
  const SplitLayout layout(p);
  const SplitItem it(p, blockIdx.y, blockIdx.x, layout.chunks);
  const RowJob job = p.jobs[it.j];
  SplitChunk<G, false>(p, layout, it, job, nullptr, smem, cs, 0, [] {});
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

// A streaming block's shared memory, reached by name from both the kernel and StreamChunk (a
// reference passed into a call that is not inlined would make every access a generic one).
struct StreamShared {
  SplitSmem smem;          // the chunk stage's, staging (smem.chunk.xs) and the finish's
  SplitChunkShared cs;
  RowJob job;              // the row's job: the chunk loop's values need the registers
  int j;                   // its index in p.jobs
  const char* row;         // column 0's address where the row is one run, else null (RowRun)
  SplitLayout layout;      // the split scratch's layout: read here, not from each thread's stack
};
__device__ __forceinline__ StreamShared& Stream() {
  __shared__ __align__(16) StreamShared shared;
  return shared;
}

// Group k of a thread's chunk (for each k in the sequence) from `from` to `to` by cp.async, at
// offset 16 * kSplitThreads * k of both: an immediate in each instruction.
template <int kOffset>
__device__ __forceinline__ void CopyGroup(unsigned int to, const char* from) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;\n" ::"r"(to), "l"(from), "n"(kOffset)
               : "memory");
}
template <int... k>
__device__ __forceinline__ void CopyGroups(unsigned int to, const char* from, std::integer_sequence<int, k...>) {
  (CopyGroup<16 * kSplitThreads * k>(to, from), ...);
}

// Chunk c of a streaming block's row into the staging buffer by cp.async (each thread its own
// 16-byte groups, at the offsets LoadChunkValues reads them from, so each thread later reads
// only what it copied itself: its own wait_group orders it, no barrier). Only a whole chunk at
// a 16-byte aligned address in one run is staged; returns whether it was (false past the row).
template <int G>
__device__ __forceinline__ bool StageChunk(const StepParams& p, int split_index, int c,
                                           int chunks, char* staging) {
  if (c >= chunks) return false;
  const SplitItem it(p, split_index, Stream().j, Stream().job.logits_row, c, chunks, Stream().row);
  if (it.run == nullptr || it.n != kSplitChunk || reinterpret_cast<uintptr_t>(it.run) % 16 != 0) {
    return false;
  }
  // Group k of thread t sits at byte 16 * (t + kSplitThreads * k) of the chunk, for either G
  // (ChunkColumn<G>(k * G) tokens of 16 / G bytes). Each copy's offset is an immediate of the
  // instruction: ptxas folds it into the shared address (the global one it still forms), one
  // instruction a copy fewer than computed addresses.
  const unsigned int to = static_cast<unsigned int>(__cvta_generic_to_shared(staging)) + 16 * threadIdx.x;
  const char* const from = it.run + 16 * threadIdx.x;
  CopyGroups(to, from, std::make_integer_sequence<int, kChunkValues / G>());
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  return true;
}

// Chunk c of a streaming block's row (SplitChunk), from staging where `staged`, the next
// chunk's copy started once this one is loaded and its updates applied. Returns whether chunk
// c + 1 is being staged. Not inlined:
// inside the chunk loop ptxas spilled ~5 KB of the chunk's values (-Xptxas -v); as a call, the
// body is allocated as the chunk block's is.
template <int G>
__device__ __noinline__ bool StreamChunk(const StepParams& p, int split_index, int c, bool staged) {
  const SplitLayout& layout = Stream().layout;
  SplitSmem& smem = Stream().smem;
  SplitChunkShared& cs = Stream().cs;
  const RowJob& job = Stream().job;
  char* const staging = reinterpret_cast<char*>(smem.chunk.xs);
  bool next_staged = false;
  SplitChunk<G, true>(p, layout,
                      SplitItem(p, split_index, Stream().j, job.logits_row, c, layout.chunks, Stream().row),
                      job, staged ? staging : nullptr, smem, cs, c & 1, [&] {
                        next_staged = StageChunk<G>(p, split_index, c + 1, layout.chunks, staging);
                      });
  return next_staged;
}

// The split path with many rows: one block a row, over its chunks in turn, each chunk exactly
// as a chunk block takes it (the same partials and lists, so the same results bit for bit),
// then the row's finish, with no arrival counter. Chunk c + 1 is copied into shared memory by
// cp.async while chunk c is worked on from registers, so each block has a chunk's loads in
// flight through its whole row instead of one burst at its start (a row with token updates
// applies them in that buffer first, then starts the copy). Used where the rows alone fill
// the GPU (split_stream). (More bytes in flight a block
// measured no faster on an H100: a second staging buffer, chunk c + 2 copied while c is worked
// on, 147.8 against 146.1 us at prefill R = 384 fp32 and 190.1 against 136.0 bf16; an L2 bulk
// prefetch of the chunk after the staged one, 150.3. A block's chain of chunks sets its time:
// gpu-notes, issue 49's fifth session; branch issue49-two-buffers.)
// (`__grid_constant__`, here and on the chunk blocks: a non-inlined call taking `p` by reference
// otherwise made every thread copy the 176-byte parameters to its stack first, and read them
// from there in every chunk: the streaming kernel's stack frame 312 -> 88 bytes, StreamChunk's
// local loads 178 -> 32 in SASS; the layout likewise from shared memory, not each thread's stack.)
template <int G>
__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSm) SplitStreamKernel(const __grid_constant__ StepParams p) {
  const SplitLayout layout(p);
  const int split_index = blockIdx.x;
  const int C = layout.chunks;
  if (threadIdx.x == 0) {
    if (unsigned long long* probe = ProbeBlockTimes(split_index)) {
      unsigned int sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      probe[0] = GlobalTimer();
      probe[2] = sm;
    }
    const int j = p.split_jobs[split_index];
    Stream().j = j;
    Stream().job = p.jobs[j];
    Stream().row = RowRun(p, Stream().job.logits_row, 0, p.vocab_size);
    Stream().layout = layout;
  }
  __syncthreads();
  char* const staging = reinterpret_cast<char*>(Stream().smem.chunk.xs);
  // Whether the current chunk is (being) copied into staging.
  bool staged = StageChunk<G>(p, split_index, 0, C, staging);
  // No barrier between chunks (one of four a chunk; ncu put 7% of the kernel's stall samples
  // at it). What a thread writes in chunk c + 1 after that chunk's S1 (the threshold, the Z
  // partials, the collected tokens) no thread still reads for chunk c: passing S1 of c + 1
  // needs every thread to have left chunk c. What it writes before S1 of c + 1 (its warp's
  // extremes and sorted maxima, token updates in xs) chunk c reads only before its own S3,
  // which this thread has passed, so every thread has too; the exception is the token count,
  // read after S3, so thread 0 zeroes the other parity's. Staging is read and refilled by
  // each thread at its own offsets only (bf16 / fp16 rows with updates: behind
  // UpdateChunkValues' barriers, a thread's floats there overlapping others' staged bytes).
  for (int c = 0; c < C; ++c) staged = StreamChunk<G>(p, split_index, c, staged);
  // The finisher reads the partials and lists through L2, as it reads other blocks'.
  __threadfence();
  __syncthreads();
  SplitFinishRow(p, split_index, Stream().smem.finish);
  if (threadIdx.x == 0) {
    if (unsigned long long* probe = ProbeBlockTimes(split_index)) probe[1] = GlobalTimer();
  }
}

}  // namespace detail

size_t SplitScratchBytes(int32_t num_split, int32_t vocab_size) {
  const size_t slots =
      static_cast<size_t>(num_split) * ((vocab_size + kSplitChunk - 1) / kSplitChunk);
  return slots * (sizeof(detail::SplitPartial) + kSplitMaxK * (sizeof(float) + sizeof(int32_t)) +
                  64 * sizeof(float));
}

LaunchConfig SplitRowsConfig(const StepParams& params) {
  if (params.split_stream != 0) {
    return LaunchConfig{"SplitStreamKernel", dim3(params.num_split), dim3(detail::kSplitThreads), 0};
  }
  return LaunchConfig{"SplitRowKernel",
                      dim3((params.vocab_size + kSplitChunk - 1) / kSplitChunk, params.num_split),
                      dim3(detail::kSplitThreads), 0};
}

cudaError_t LaunchSplitRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_split == 0) return cudaSuccess;
  const LaunchConfig config = SplitRowsConfig(params);
  const bool fp32 = params.dtype == DType::kFloat32;
  if (params.split_stream != 0) {
    if (fp32) {
      detail::SplitStreamKernel<4><<<config.grid, config.block, 0, stream>>>(params);
    } else {
      detail::SplitStreamKernel<8><<<config.grid, config.block, 0, stream>>>(params);
    }
  } else if (fp32) {
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
