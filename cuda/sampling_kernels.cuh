// Device code of samplerd's sampling kernels (private to cuda/). See sampling_launch.h.
//
// Conventions: one block of kSampleThreads threads per row job in the sampling kernel; every
// reduction is a per-thread loop over a fixed stride followed by a fixed tree, so the result
// depends on V and the block size only. Probability masses used for selection are fixed-point
// integers (2^-40 units), summed with integer atomics: exact, so order-independent.
#ifndef SAMPLERD_CUDA_SAMPLING_KERNELS_CUH_
#define SAMPLERD_CUDA_SAMPLING_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda/sampling_launch.h"
#include "sampler/spec_rules.h"

namespace samplerd {
namespace cuda {
namespace detail {

constexpr int kPrepareThreads = 256;
constexpr int kPrepareChunk = 4096;     // elements of one row per prepare block
constexpr int kSampleThreads = 1024;
constexpr int kCandidateCapacity = 2048;
constexpr int kClusterBlocks = 8;       // blocks (one cluster) per row in the fused path
constexpr int kClusterThreads = 512;
constexpr size_t kMaxFusedChunkBytes = 160 * 1024;  // dynamic shared memory per block
constexpr int kDistanceBins = 256;      // distance-from-max histogram, 0.25 nat bins
constexpr float kBinsPerNat = 4.0f;
constexpr double kMassScale = 1099511627776.0;  // 2^40
constexpr int kSplitMaxChunks = 64;     // split path: SplitPathEligible keeps chunks * top_k <= 2048
constexpr float kNegInf = -INFINITY;

// OrderKey (sampler/spec_rules.h) back to the float.
__device__ __forceinline__ float FromOrderKey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// log2(e) / T: the fast passes take exp(s - M) as exp2((x - max) * this). At least FLT_MIN, so
// that T = +inf (where every finite score is +-0) still maps x = -inf to -inf and not to NaN
// (-inf * 0), and a finite x to 2^-0 = 1; only T > ~1.2e38 is affected, where every finite
// term is 1 either way.
__device__ __forceinline__ float Log2eOverT(float T) { return fmaxf(1.4426950408889634f / T, FLT_MIN); }

__device__ __forceinline__ float LoadLogit(const void* row, DType dtype, int32_t c) {
  switch (dtype) {
    case DType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(row)[c]);
    case DType::kFloat16:
      return __half2float(static_cast<const __half*>(row)[c]);
    default:
      return static_cast<const float*>(row)[c];
  }
}

// Bytes of one logit of `dtype` (float32 4; bfloat16 and float16 2).
__device__ __forceinline__ int LogitBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Where the kernels read a job's logits: the address of column `lo` of row `logits_row` when
// columns [lo, lo + n) are one contiguous run (always, for one tensor; within one shard, for
// tensor-parallel shards), else null: the caller then loads column by column (LoadLogitAt).
// Every load path takes its run once per chunk, so one tensor costs what it did before shards.
__device__ __forceinline__ const char* RowRun(const StepParams& p, int32_t logits_row, int32_t lo,
                                              int32_t n) {
  const int elem = LogitBytes(p.dtype);
  if (p.num_shards == 0) {
    return static_cast<const char*>(p.logits) +
           (static_cast<int64_t>(logits_row) * p.row_stride + lo) * elem;
  }
  for (int s = 0; s < p.num_shards; ++s) {
    const DeviceShard& shard = p.shards[s];
    if (lo >= shard.col_begin && lo + n <= shard.col_end) {
      return shard.data + (static_cast<int64_t>(logits_row) * shard.row_stride + (lo - shard.col_begin)) * elem;
    }
  }
  return nullptr;
}

// The columns of one row a thread reads in rising order, across tensor-parallel shards
// (num_shards > 0): a chunk that straddles shards (RowRun null). Each column's shard is found by walking the table on
// from the last one, so a thread's pass costs one comparison a column and one step a boundary
// (a lookup from the start for every column made the straddling chunk the step's slowest).
class ShardWalker {
 public:
  // `first`: the first column this thread will ask for.
  __device__ ShardWalker(const StepParams& p, int32_t logits_row, int32_t first)
      : p_(p), row_(logits_row), elem_(LogitBytes(p.dtype)) {
    while (s_ + 1 < p.num_shards && first >= p.shards[s_ + 1].col_begin) ++s_;
    Enter();
  }
  // Column c's address; c is at or past every column this thread asked for before.
  __device__ __forceinline__ const char* At(int32_t c) {
    while (c >= end_ && s_ + 1 < p_.num_shards) {
      ++s_;
      Enter();
    }
    return base_ + static_cast<int64_t>(c - begin_) * elem_;
  }
  // The end of the shard of the column At returned last: columns up to it are contiguous.
  __device__ __forceinline__ int32_t end() const { return end_; }

 private:
  __device__ __forceinline__ void Enter() {
    const DeviceShard& shard = p_.shards[s_];
    begin_ = shard.col_begin;
    end_ = shard.col_end;
    base_ = shard.data + static_cast<int64_t>(row_) * shard.row_stride * elem_;
  }
  const StepParams& p_;
  const int32_t row_;
  const int elem_;
  int s_ = 0;
  int32_t begin_ = 0, end_ = 0;
  const char* base_ = nullptr;
};

// Column c of row `logits_row`, whichever shard holds it: the general kernel's whole-row
// scans (one column at a time, in no order a walker could use).
__device__ __forceinline__ float LoadLogitAt(const StepParams& p, int32_t logits_row, int32_t c) {
  if (p.num_shards == 0) return LoadLogit(RowRun(p, logits_row, 0, 0), p.dtype, c);
  return LoadLogit(ShardWalker(p, logits_row, c).At(c), p.dtype, 0);
}

// The draft logprob of token c (>= 0) of a verify job's q row (RowJob::q_values): a dense
// row's entry, or a top-N row's value at the first entry naming c (-inf where none does, as
// the CPU's DraftRowView). Read in place: never more than the entries verification needs.
__device__ __forceinline__ float DraftLogprob(const RowJob& job, int32_t c) {
  if (job.q_n == 0) return LoadLogit(job.q_values, job.q_dtype, c);
  for (int32_t i = 0; i < job.q_n; ++i) {
    if (job.q_ids[i] == c) return LoadLogit(job.q_values, job.q_dtype, i);
  }
  return kNegInf;
}

// Eight bf16 / fp16 logits from one 16-byte load, in memory order.
__device__ __forceinline__ void Unpack16(const uint4& v, DType dtype, float (&out)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint16_t lo16 = static_cast<uint16_t>(words[w] & 0xFFFFu);
    const uint16_t hi16 = static_cast<uint16_t>(words[w] >> 16);
    if (dtype == DType::kBFloat16) {
      out[2 * w] = __uint_as_float(static_cast<uint32_t>(lo16) << 16);
      out[2 * w + 1] = __uint_as_float(static_cast<uint32_t>(hi16) << 16);
    } else {
      out[2 * w] = __half2float(__ushort_as_half(lo16));
      out[2 * w + 1] = __half2float(__ushort_as_half(hi16));
    }
  }
}

__device__ __forceinline__ unsigned long long ToMass(double p) {
  return __double2ull_rn(p * kMassScale);
}

// Block-wide reductions in a fixed order (warp shuffles, then warp 0 over the warp results).
template <typename T, typename Op>
__device__ T BlockReduce(T value, Op op, T* scratch /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_down_sync(0xFFFFFFFFu, value, offset));
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  if (warp == 0) {
    value = lane < warps ? scratch[lane] : scratch[0];
    T acc = value;
    // Lanes >= warps hold a copy of scratch[0]; reduce only the first `warps` lanes.
    for (int offset = 16; offset > 0; offset >>= 1) {
      const T other = __shfl_down_sync(0xFFFFFFFFu, acc, offset);
      if (lane + offset < warps) acc = op(acc, other);
    }
    // Every lane read scratch[] above; the shuffles order that in practice, but only a warp
    // barrier orders shared memory (compute-sanitizer racecheck flagged the write below).
    __syncwarp();
    if (lane == 0) scratch[0] = acc;
  }
  __syncthreads();
  const T out = scratch[0];
  __syncthreads();
  return out;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct OrOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a | b; }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// Exclusive prefix sum over the block in thread order; returns the block total in *total.
template <typename T>
__device__ T BlockExclusiveScan(T value, T* total, T* scratch /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const T other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    T v = lane < warps ? scratch[lane] : T(0);
    for (int offset = 1; offset < 32; offset <<= 1) {
      const T other = __shfl_up_sync(0xFFFFFFFFu, v, offset);
      if (lane >= offset) v += other;
    }
    scratch[lane] = v;  // inclusive over warps
  }
  __syncthreads();
  const T warp_before = warp > 0 ? scratch[warp - 1] : T(0);
  *total = scratch[(blockDim.x >> 5) - 1];
  __syncthreads();
  return warp_before + inclusive - value;
}

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_SAMPLING_KERNELS_CUH_
