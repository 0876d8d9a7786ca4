// Device code, private to cuda/: the per-block shared state and the selection primitives
// every path uses for SPEC's order "score descending, ties by lower id": radix selection over
// a row, the bitonic sort of candidates, fixed-order prefix sums and the interval search of a
// draw.
#ifndef SAMPLERD_CUDA_KERNELS_SELECTION_CUH_
#define SAMPLERD_CUDA_KERNELS_SELECTION_CUH_

#include "cuda/sampling_kernels.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// ---------------------------------------------------------------------------------------------
// Sampling: one block per job.

struct Shared {
  unsigned int hist_count[kDistanceBins];
  unsigned long long hist_mass[kDistanceBins];
  int cand_id[kCandidateCapacity];
  float cand_s[kCandidateCapacity];    // the candidate's score s
  float cand_key[kCandidateCapacity];  // the sort key (s, or a residual's float image)
  double cum[kCandidateCapacity];      // inclusive prefix of weights in list order
  float scratch_f[32];
  double scratch_d[32];
  int scratch_i[32];
  unsigned long long scratch_u[32];
  unsigned int scratch_k[32];
  int count;
  unsigned int sel_key;
  int sel_id;
  unsigned long long sel_rest;
};

// The row's scores s = x / T with force top-N applied; keptN by threshold (key, id) on x.
// Top-nσ (SPEC 3 step 4, after force top-N) removes x < sigma_floor (compared in float64).
struct RowScores {
  const float* x;
  int V;
  float T;
  bool force;
  uint32_t n_key;
  int n_id;
  double sigma_floor = -INFINITY;
  // x after step 4 (force top-N, then top-nσ): -inf where removed.
  __device__ float Kept(int c) const {
    const float v = x[c];
    if (v == kNegInf) return kNegInf;
    if (force) {
      const uint32_t k = OrderKey(v);
      if (!(k > n_key || (k == n_key && c <= n_id))) return kNegInf;
    }
    if (static_cast<double>(v) < sigma_floor) return kNegInf;
    return v;
  }
  __device__ float operator()(int c) const {
    const float v = Kept(c);
    return v == kNegInf ? kNegInf : v / T;
  }
  // Whether the temperature pushes token c's finite, kept x out of the float32 range.
  __device__ bool Overflows(int c) const {
    const float v = Kept(c);
    return v != kNegInf && isinf(v / T);
  }
};

// Elements ranked at or before the cut (key, id) in the order "score desc, id asc".
__device__ __forceinline__ bool AtOrBefore(uint32_t key, int id, uint32_t cut_key, int cut_id) {
  return key > cut_key || (key == cut_key && id <= cut_id);
}

// Finds, over c in [0, V) with pred(c) true, the element at which the running total of
// weight(c) in order (key desc, id asc) first exceeds `target` (weights: integer units; count
// selection is weight 1 and target k - 1). Sets sh.sel_key/sel_id; sel_id = -1 when the total
// does not exceed the target. 8-bit radix rounds over the key (four for a 32-bit KEY, eight
// for a 64-bit one: a residual's float64 order key), then an id-order scan.
template <typename KEY = uint32_t, typename WeightFn>
static __device__ void RadixSelect(Shared& sh, int V, WeightFn weight_of, unsigned long long target) {
  KEY prefix = 0, prefix_mask = 0;
  unsigned long long rest = target;
  for (int shift = 8 * static_cast<int>(sizeof(KEY)) - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.hist_mass[b] = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      KEY k;
      const unsigned long long w = weight_of(c, &k);
      if (w == 0 || (k & prefix_mask) != prefix) continue;
      atomicAdd(&sh.hist_mass[(k >> shift) & 255u], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long before = 0;
      int digit = -1;
      for (int d = 255; d >= 0; --d) {
        if (before + sh.hist_mass[d] > rest) {
          digit = d;
          break;
        }
        before += sh.hist_mass[d];
      }
      sh.sel_id = digit;  // temporarily the digit
      sh.sel_rest = digit >= 0 ? rest - before : 0;
    }
    __syncthreads();
    if (sh.sel_id < 0) {  // no digit: the total does not exceed the target; sel_id is -1
      __syncthreads();
      return;
    }
    prefix |= static_cast<KEY>(sh.sel_id) << shift;
    prefix_mask |= static_cast<KEY>(255u) << shift;
    rest = sh.sel_rest;
    __syncthreads();
  }
  // Among elements with exactly this key, in id order: the first whose inclusive total
  // exceeds `rest`.
  if (threadIdx.x == 0) sh.sel_id = -1;
  __syncthreads();
  unsigned long long running = 0;
  for (int tile = 0; tile < V; tile += blockDim.x) {
    const int c = tile + threadIdx.x;
    unsigned long long w = 0;
    if (c < V) {
      KEY k;
      w = weight_of(c, &k);
      if (k != prefix) w = 0;
    }
    unsigned long long total;
    const unsigned long long before = running + BlockExclusiveScan(w, &total, sh.scratch_u);
    if (w > 0 && before <= rest && before + w > rest) {
      sh.sel_key = static_cast<unsigned int>(prefix);  // 32-bit keys; 64-bit callers read sel_id
      sh.sel_id = c;
    }
    running += total;
    __syncthreads();
    if (running > rest) break;
  }
  __syncthreads();
}

// The top-k cut: the row's K-th token in the order (score desc, id asc) over its finite scores
// score_of(c), in sh.sel_key / sh.sel_id; sel_id = -1 where fewer than K are finite (then
// every finite token is kept). One selection for the general path and the split path's flat
// rows, so both cut where SPEC 3 step 5 says.
template <typename ScoreFn>
static __device__ void SelectTopKCut(Shared& sh, int V, int K, ScoreFn score_of) {
  RadixSelect(sh, V,
              [&](int c, uint32_t* k) -> unsigned long long {
                const float s = score_of(c);
                *k = OrderKey(s);
                return s == kNegInf ? 0ull : 1ull;
              },
              static_cast<unsigned long long>(K - 1));
}

// Sorts candidates [0, n) by `keys` descending, ties by lower id (bitonic, in shared memory),
// moving cand_s and cand_id with their keys. `keys` is sh.cand_key (float: scores) or sh.cum
// (double: a verify row's residuals p - q, whose order a float image loses where two residuals
// differ by less than float precision, e.g. tokens of equal p with q of 0 and 1e-12: the CPU
// backend orders those by their float64 values, and SPEC 5 by their exact ones).
template <typename KEY>
static __device__ void SortCandidatesBy(Shared& sh, int n, KEY* keys) {
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += blockDim.x) {
    keys[i] = -INFINITY;
    sh.cand_s[i] = kNegInf;
    sh.cand_id[i] = 0x7FFFFFFF;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const KEY ki = keys[i], kp = keys[partner];
          const int ii = sh.cand_id[i], ip = sh.cand_id[partner];
          const bool i_first = ki > kp || (ki == kp && ii < ip);
          const bool best_first = (i & k) == 0;
          if (i_first != best_first) {
            keys[i] = kp;
            keys[partner] = ki;
            const float si = sh.cand_s[i];
            sh.cand_s[i] = sh.cand_s[partner];
            sh.cand_s[partner] = si;
            sh.cand_id[i] = ip;
            sh.cand_id[partner] = ii;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Sorts candidates [0, n) by cand_key descending, ties by lower id.
static __device__ void SortCandidates(Shared& sh, int n) { SortCandidatesBy(sh, n, sh.cand_key); }

// Inclusive prefix sums of w(i) over [0, n) into sh.cum (fixed tree order); returns the total.
template <typename WFn>
static __device__ double PrefixSums(Shared& sh, int n, WFn w) {
  const int per = (n + blockDim.x - 1) / blockDim.x;  // contiguous run per thread
  const int begin = threadIdx.x * per, end = min(n, begin + per);
  double local = 0.0;
  for (int i = begin; i < end; ++i) {
    local += w(i);
    sh.cum[i] = local;
  }
  double total;
  const double before = BlockExclusiveScan(local, &total, sh.scratch_d);
  for (int i = begin; i < end; ++i) sh.cum[i] += before;
  __syncthreads();
  return total;
}

// The first index i in [0, n) with pred(i) true; n if none. Block-uniform (it synchronises):
// the cuts of a kept prefix (top-p, min-p, XTC) are each the first index that fails.
template <typename Pred>
static __device__ int FirstWhere(Shared& sh, int n, Pred pred) {
  if (threadIdx.x == 0) sh.count = n;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (pred(i)) atomicMin(&sh.count, i);
  }
  __syncthreads();
  const int first = sh.count;
  __syncthreads();
  return first;
}

// The first index in [0, n) whose inclusive prefix exceeds `target`; n - 1 if none.
static __device__ int FirstExceeding(Shared& sh, int n, double target) {
  if (threadIdx.x == 0) sh.count = n - 1;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const double before = i > 0 ? sh.cum[i - 1] : 0.0;
    if (sh.cum[i] > target && before <= target) atomicMin(&sh.count, i);
  }
  __syncthreads();
  const int out = sh.count;
  __syncthreads();
  return out;
}

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_KERNELS_SELECTION_CUH_
