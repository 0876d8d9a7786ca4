// Device code, private to cuda/: the row prologue every path shares (SPEC 3 steps 1-3 and the
// row's faults): the float32-range checks of the temperature, the row status, loading a chunk
// of a row (padding, NaN, grammar mask, the token updates by spec_rules.h's UpdateToken), and
// the benchmarks' stage stamps (stage_probe.h).
#ifndef SAMPLERD_CUDA_KERNELS_ROW_PROLOGUE_CUH_
#define SAMPLERD_CUDA_KERNELS_ROW_PROLOGUE_CUH_

#include "cuda/sampling_kernels.cuh"
#include "cuda/stage_probe.h"

namespace samplerd {
namespace cuda {
namespace detail {

// The temperature step on a row whose finite values of x lie in [x_min, x_max]: division by
// T > 0 is monotone, so some finite x / T overflows iff an extreme one does. x_min = +inf and
// x_max = -inf when nothing is finite.
__device__ __forceinline__ bool TemperatureOverflows(float x_min, float x_max, float T) {
  return (x_max != kNegInf && isinf(x_max / T)) || (x_min != INFINITY && isinf(x_min / T));
}

// The row's status from what the load found (`bad`: kRowNonFinite / kRowOverflow bits), its
// extreme finite values and T: 0 when the row can be sampled. `check_temperature` false: the
// caller's general algorithm checks the temperature later (force top-N decides first which
// values it sees).
__device__ __forceinline__ int32_t RowFault(int bad, float x_min, float x_max, float T,
                                            bool check_temperature) {
  if (bad & kRowNonFinite) return kRowNonFinite;
  if ((bad & kRowOverflow) || (check_temperature && TemperatureOverflows(x_min, x_max, T))) {
    return kRowOverflow;
  }
  if (x_max == kNegInf) return kRowNoToken;
  return 0;
}

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The benchmarks' stage probe (stage_probe.h): in the instrumented archive only. In production
// ProbeTimes() is a constant null and ProbeFlags() 0, so the stamps and switches compile away.
#if defined(SAMPLERD_STAGE_PROBE)
// One copy per translation unit (no relocatable device code): SetStageProbe sets each.
static __constant__ StageProbe g_stage_probe;
__device__ __forceinline__ unsigned long long* ProbeTimes() { return g_stage_probe.stage_times; }
__device__ __forceinline__ int32_t ProbeFlags() { return g_stage_probe.flags; }
// Block b's {start, end, SM} entries where the probe records blocks and b is among them.
__device__ __forceinline__ unsigned long long* ProbeBlockTimes(int b) {
  return g_stage_probe.block_times != nullptr && b < g_stage_probe.max_blocks
             ? g_stage_probe.block_times + 3 * static_cast<int64_t>(b)
             : nullptr;
}
// Chunk c's kProbeChunkStamps stamps of split job 0 (start, staged data arrived, loaded, S1,
// S2, S3, end), for its first kProbeChunks chunks; else null.
__device__ __forceinline__ unsigned long long* ProbeChunkTimes(int c) {
  return g_stage_probe.stage_times != nullptr && c < kProbeChunks
             ? g_stage_probe.stage_times + kProbeChunkBase + kProbeChunkStamps * c
             : nullptr;
}
#else
__device__ __forceinline__ unsigned long long* ProbeTimes() { return nullptr; }
__device__ __forceinline__ unsigned long long* ProbeChunkTimes(int) { return nullptr; }
__device__ __forceinline__ int32_t ProbeFlags() { return 0; }
__device__ __forceinline__ unsigned long long* ProbeBlockTimes(int) { return nullptr; }
#endif

// Sets this translation unit's copy of the probe (each path's unit wraps it for SetStageProbe).
static cudaError_t SetThisUnitsStageProbe(const StageProbe& probe) {
#if defined(SAMPLERD_STAGE_PROBE)
  return cudaMemcpyToSymbol(g_stage_probe, &probe, sizeof(probe));
#else
  (void)probe;
  return cudaErrorNotSupported;  // the production kernels carry no probe
#endif
}

// SPEC 3 steps 1-2a on one loaded logit v of token c, and what a load must find on the way:
// NaN / +inf in a real column (kRowNonFinite in `bad`), the max `m` and the least finite value
// `mn` (+inf if none) of x. `mask` is the job's grammar mask where it applies (null: none;
// never for prompt rows: RowMask). Per-thread partials: the caller reduces them over the block.
struct LoadStats {
  int bad = 0;
  float m = kNegInf, mn = INFINITY;
  __device__ __forceinline__ float Admit(float v, const unsigned char* mask, int c) {
    bad |= !(v < INFINITY) ? kRowNonFinite : 0;
    if (mask != nullptr && !MaskAllows(mask, c)) v = kNegInf;
    Extremes(v);
    return v;
  }
  __device__ __forceinline__ void Extremes(float v) {
    m = fmaxf(m, v);
    mn = fminf(mn, v == kNegInf ? INFINITY : v);
  }
  // Forgets the extremes (updates moved the values; Extremes on each takes them again).
  __device__ __forceinline__ void RestartExtremes() {
    m = kNegInf;
    mn = INFINITY;
  }
  // Admit on N values where no mask applies, in 2 instructions a value instead of 5: the max
  // by max.NaN, which a NaN turns into NaN (as +inf turns it into +inf), so that one test of it
  // finds both faults; the least value with -inf included and, only in a thread that holds a
  // -inf, again over the finite ones. The same bad and mn as Admit on each, and the same m
  // where bad is clear (where it is set, m may be NaN: the row fails on its status whatever
  // else its chunks hold).
  template <int N>
  __device__ __forceinline__ void AdmitUnmasked(const float (&v)[N]) {
    float hi = m, lo = INFINITY;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      asm("max.NaN.f32 %0, %0, %1;" : "+f"(hi) : "f"(v[i]));
      lo = fminf(lo, v[i]);
    }
    if (lo == kNegInf) {
      lo = INFINITY;
#pragma unroll
      for (int i = 0; i < N; ++i) lo = fminf(lo, v[i] == kNegInf ? INFINITY : v[i]);
    }
    m = hi;
    mn = fminf(mn, lo);
    if (!(hi < INFINITY)) bad |= kRowNonFinite;
  }
};

// The grammar mask a job's load applies: prompt rows score the prompt as given (SPEC 3 step 1).
__device__ __forceinline__ const unsigned char* RowMask(const RowJob& job) {
  return job.kind == kRowPrompt ? nullptr : job.mask;
}

// The job's sparse token updates (SPEC 3 steps 2b-d and 3) that fall in tokens [lo, lo + n),
// applied to xs (token lo + i at xs[i]); one pushing a finite value out of float32 sets
// kRowOverflow in stats->bad. Returns whether this thread changed anything (the caller's
// __syncthreads_or tells the block, which then takes the extremes again). The caller
// synchronizes before (xs written) and after.
static __device__ bool ApplyChunkUpdates(const StepParams& p, const RowJob& job, int lo, int n,
                                         float* xs, LoadStats* stats) {
  bool touched = false;
  for (int k = job.update_begin + threadIdx.x; k < job.update_end; k += blockDim.x) {
    const RowUpdate u = p.updates[k];
    const int32_t t = u.update.token;
    if (t < lo || t >= lo + n) continue;
    bool left_range = false;
    xs[t - lo] = UpdateToken(xs[t - lo], u.update, u.penalties, &left_range);
    if (left_range) stats->bad |= kRowOverflow;
    touched = true;
  }
  return touched;
}

// Loads elements [lo, lo + n) of a job's logits row into xs (padding is never read) in one
// pass (LoadStats::Admit), then the job's updates that fall in the chunk, and the extremes
// again where one did: a row's few updates leave most of its chunks as they were loaded.
// Per-thread partials in *bad_out, *m_out, *mn_out. Any block size.
static __device__ void LoadChunk(const StepParams& p, const RowJob& job, int lo, int n,
                          float* xs, int* bad_out, float* m_out, float* mn_out) {
  const unsigned char* mask = RowMask(job);
  LoadStats st;
  auto admitted = [&](int i, float v) { return st.Admit(v, mask, lo + i); };
  // Column lo's address; null where the chunk straddles two tensor-parallel shards.
  const char* run = RowRun(p, job.logits_row, lo, n);
  // 16-byte loads, and 16-byte stores into xs: four scalar stores a thread would hit the same
  // shared-memory banks four ways.
  const bool xs_aligned = reinterpret_cast<uintptr_t>(xs) % 16 == 0;
  const bool run_aligned = run != nullptr && reinterpret_cast<uintptr_t>(run) % 16 == 0;
  const bool vector_f32 = p.dtype == DType::kFloat32 && xs_aligned && run_aligned;
  if (vector_f32) {
    const float4* src = reinterpret_cast<const float4*>(run);
    float4* dst = reinterpret_cast<float4*>(xs);
    const int n4 = n / 4;
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = src[i];
      dst[i] = make_float4(admitted(4 * i, v.x), admitted(4 * i + 1, v.y),
                           admitted(4 * i + 2, v.z), admitted(4 * i + 3, v.w));
    }
    for (int i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) {
      xs[i] = admitted(i, reinterpret_cast<const float*>(run)[i]);
    }
  } else if (p.dtype != DType::kFloat32 && xs_aligned && run_aligned) {
    // 16-byte loads of eight bf16 / fp16 values.
    const uint4* src = reinterpret_cast<const uint4*>(run);
    float4* dst = reinterpret_cast<float4*>(xs);
    const int n8 = n / 8;
#pragma unroll 2
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
      float out[8];
      Unpack16(src[i], p.dtype, out);
#pragma unroll
      for (int w = 0; w < 8; ++w) out[w] = admitted(8 * i + w, out[w]);
      dst[2 * i] = make_float4(out[0], out[1], out[2], out[3]);
      dst[2 * i + 1] = make_float4(out[4], out[5], out[6], out[7]);
    }
    for (int i = 8 * n8 + threadIdx.x; i < n; i += blockDim.x) xs[i] = admitted(i, LoadLogit(run, p.dtype, i));
  } else if (run != nullptr) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) xs[i] = admitted(i, LoadLogit(run, p.dtype, i));
  } else {
    ShardWalker walk(p, job.logits_row, lo + threadIdx.x);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      xs[i] = admitted(i, LoadLogit(walk.At(lo + i), p.dtype, 0));
    }
  }
  if (job.update_end > job.update_begin) {
    __syncthreads();
    if (__syncthreads_or(ApplyChunkUpdates(p, job, lo, n, xs, &st))) {
      st.RestartExtremes();
      for (int i = threadIdx.x; i < n; i += blockDim.x) st.Extremes(xs[i]);
    }
  }
  *bad_out = st.bad;
  *m_out = st.m;
  *mn_out = st.mn;
}

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_KERNELS_ROW_PROLOGUE_CUH_
