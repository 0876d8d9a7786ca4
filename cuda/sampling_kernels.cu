// samplerd's CUDA sampling kernels: SPEC sections 3-7 on device. See sampling_launch.h for
// the launch sequence and sampling_kernels.cuh for the conventions.
#include <cfloat>
#include <cmath>

#include "cuda/sampling_kernels.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

constexpr float kNegInf = -INFINITY;

// ---------------------------------------------------------------------------------------------
// Prepare: logits -> x (padding, NaN check, grammar mask), and each row's max of x.
__global__ void __launch_bounds__(kPrepareThreads) PrepareRowsKernel(StepParams p) {
  const int job_index = blockIdx.y;
  const RowJob& job = p.jobs[job_index];
  const int V = p.vocab_size;
  const int begin = blockIdx.x * kPrepareChunk;
  const int end = min(V, begin + kPrepareChunk);
  const int elem = p.dtype == kF32 ? 4 : 2;
  const void* row = static_cast<const char*>(p.logits) +
                    static_cast<int64_t>(job.logits_row) * p.row_stride * elem;
  float* x = p.workspace + static_cast<int64_t>(job_index) * V;
  const bool use_mask = job.mask != nullptr && job.kind != kRowPrompt;
  float local_max = kNegInf;
  int bad = 0;
  for (int c = begin + threadIdx.x; c < end; c += kPrepareThreads) {
    float v = LoadLogit(row, p.dtype, c);
    bad |= !(v < INFINITY);  // NaN or +inf in a real column
    if (use_mask && ((job.mask[c >> 3] >> (c & 7)) & 1) == 0) v = kNegInf;
    x[c] = v;
    local_max = fmaxf(local_max, v);
  }
  __shared__ float scratch_f[32];
  __shared__ int scratch_i[32];
  local_max = BlockReduce(local_max, MaxOp(), scratch_f);
  bad = BlockReduce(bad, MaxOp(), scratch_i);
  if (threadIdx.x == 0) {
    if (bad) atomicOr(reinterpret_cast<int*>(&p.results[job_index].status), 1);
    atomicMax(&p.row_max[job_index], OrderKey(local_max));  // max is order-independent
  }
}

// Penalties: one thread per (job, token) entry; entries of a job name distinct tokens.
__global__ void PenaltiesKernel(StepParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.num_penalties) return;
  // Find the job owning entry i (jobs' ranges are sorted and disjoint).
  int lo = 0, hi = p.num_jobs - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (p.jobs[mid].penalty_end <= i) lo = mid + 1; else hi = mid;
  }
  const Penalty& pen = p.penalties[i];
  float* x = p.workspace + static_cast<int64_t>(lo) * p.vocab_size;
  float v = x[pen.token];
  if (pen.repetition != 1.0f) v = v > 0.0f ? v / pen.repetition : v * pen.repetition;
  if (pen.count > 0) v = v - (pen.presence + pen.frequency * static_cast<float>(pen.count));
  x[pen.token] = v;
}

// ---------------------------------------------------------------------------------------------
// Sampling: one block per job.

struct Shared {
  unsigned int hist_count[kDistanceBins];
  unsigned long long hist_mass[kDistanceBins];
  int cand_id[kCandidateCapacity];
  float cand_s[kCandidateCapacity];
  double cum[kCandidateCapacity];  // inclusive prefix of weights in list order
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
struct RowScores {
  const float* x;
  int V;
  float T;
  bool force;
  uint32_t n_key;
  int n_id;
  __device__ float operator()(int c) const {
    const float v = x[c];
    if (v == kNegInf) return kNegInf;
    if (force) {
      const uint32_t k = OrderKey(v);
      if (!(k > n_key || (k == n_key && c <= n_id))) return kNegInf;
    }
    return v / T;
  }
};

// Elements ranked at or before the cut (key, id) in the order "score desc, id asc".
__device__ __forceinline__ bool AtOrBefore(uint32_t key, int id, uint32_t cut_key, int cut_id) {
  return key > cut_key || (key == cut_key && id <= cut_id);
}

// Finds, over c in [0, V) with pred(c) true, the element at which the running total of
// weight(c) in order (key desc, id asc) first exceeds `target` (weights: integer units; count
// selection is weight 1 and target k - 1). Sets sh.sel_key/sel_id; sel_id = -1 when the total
// does not exceed the target. Four 8-bit radix rounds over the key, then an id-order scan.
template <typename WeightFn>
__device__ void RadixSelect(Shared& sh, int V, WeightFn weight_of, unsigned long long target) {
  uint32_t prefix = 0, prefix_mask = 0;
  unsigned long long rest = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.hist_mass[b] = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      uint32_t k;
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
    if (sh.sel_id < 0) {
      if (threadIdx.x == 0) sh.sel_id = -1;
      __syncthreads();
      return;
    }
    prefix |= static_cast<uint32_t>(sh.sel_id) << shift;
    prefix_mask |= 255u << shift;
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
      uint32_t k;
      w = weight_of(c, &k);
      if (k != prefix) w = 0;
    }
    unsigned long long total;
    const unsigned long long before = running + BlockExclusiveScan(w, &total, sh.scratch_u);
    if (w > 0 && before <= rest && before + w > rest) {
      sh.sel_key = prefix;
      sh.sel_id = c;
    }
    running += total;
    __syncthreads();
    if (running > rest) break;
  }
  __syncthreads();
}

// Bitonic sort of sh.cand_* [0, n) by (score desc, id asc); n padded to a power of two with
// (-inf, INT_MAX) sentinels.
__device__ void SortCandidates(Shared& sh, int n) {
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += blockDim.x) {
    sh.cand_s[i] = kNegInf;
    sh.cand_id[i] = 0x7FFFFFFF;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const float si = sh.cand_s[i], sp = sh.cand_s[partner];
          const int ii = sh.cand_id[i], ip = sh.cand_id[partner];
          const bool i_first = si > sp || (si == sp && ii < ip);
          const bool ascending = (i & k) == 0;  // "ascending" = best first here
          if (i_first != ascending) {
            sh.cand_s[i] = sp;
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

// Inclusive prefix sums of w(i) over [0, n) into sh.cum (fixed tree order); returns the total.
template <typename WFn>
__device__ double PrefixSums(Shared& sh, int n, WFn w) {
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

// The first index in [0, n) whose inclusive prefix exceeds `target`; n - 1 if none.
__device__ int FirstExceeding(Shared& sh, int n, double target) {
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

__global__ void __launch_bounds__(kSampleThreads) SampleRowsKernel(StepParams p) {
  __shared__ Shared sh;
  const int j = blockIdx.x;
  const RowJob job = p.jobs[j];
  RowResult& out = p.results[j];
  const int V = p.vocab_size;
  const float* x = p.workspace + static_cast<int64_t>(j) * V;
  if (out.status != 0) return;  // NaN / +inf found by the prepare kernel
  const bool prompt = job.kind == kRowPrompt;
  const bool has_penalties = job.penalty_end > job.penalty_begin;
  const int force_n = prompt ? 0 : job.force_top_n;
  RowScores scores{x, V, job.temperature, false, 0u, 0};

  // Row max of x (the prepare kernel's, unless penalties moved values).
  float x_max = FromOrderKey(p.row_max[j]);
  if (has_penalties) {
    float m = kNegInf;
    for (int c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, x[c]);
    x_max = BlockReduce(m, MaxOp(), sh.scratch_f);
  }
  if (x_max == kNegInf) {
    if (threadIdx.x == 0) out.status = 2;
    return;
  }
  // Force top-N: the N-th element of x in order (x desc, id asc) is the threshold.
  if (force_n > 0 && force_n < V) {
    RadixSelect(sh, V,
                [&](int c, uint32_t* k) -> unsigned long long {
                  const float v = x[c];
                  *k = OrderKey(v);
                  return v == kNegInf ? 0ull : 1ull;
                },
                static_cast<unsigned long long>(force_n - 1));
    if (sh.sel_id >= 0) {
      scores.force = true;
      scores.n_key = sh.sel_key;
      scores.n_id = sh.sel_id;
    }
    __syncthreads();
  }
  // Temperature: division by T > 0 is monotone, so max(s) = max(x) / T exactly.
  const float M = x_max / job.temperature;
  // Pass: Z = sum exp(s - M) (float64, fixed order) and the distance-from-max histogram.
  for (int b = threadIdx.x; b < kDistanceBins; b += blockDim.x) {
    sh.hist_count[b] = 0;
    sh.hist_mass[b] = 0;
  }
  __syncthreads();
  double z_local = 0.0;
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    const float s = scores(c);
    if (s == kNegInf) continue;
    const float e = expf(s - M);
    z_local += e;
    const float d = (M - s) * kBinsPerNat;
    const int bin = d < static_cast<float>(kDistanceBins - 1) ? static_cast<int>(d) : kDistanceBins - 1;
    atomicAdd(&sh.hist_count[bin], 1u);
    atomicAdd(&sh.hist_mass[bin], ToMass(e));
  }
  const double Z = BlockReduce(z_local, SumOp(), sh.scratch_d);
  const double Z_mass = [&] {
    unsigned long long local = 0;
    for (int b = threadIdx.x; b < kDistanceBins; b += blockDim.x) local += sh.hist_mass[b];
    return static_cast<double>(BlockReduce(local, SumOp(), sh.scratch_u));
  }();

  // How far from the max the kept set (and the top logprobs) can reach: the smallest bin
  // count such that the bins before it surely hold them.
  const bool top_k = job.top_k > 0 && job.top_k < V;
  const bool top_p = job.top_p < 1.0f;
  const float min_p = prompt ? 0.0f : job.min_p;
  if (threadIdx.x == 0) {
    // The candidate set is bins [0, last]: a prefix of the order (bins are ranges of s). It
    // must surely hold the kept set: top-k: k tokens; top-p alone: more mass than top_p (with a
    // margin over the fixed-point rounding); min-p alone: every token with p >= min_p * p_max;
    // none of them: every finite token.
    unsigned int finite = 0;
    for (int b = 0; b < kDistanceBins; ++b) finite += sh.hist_count[b];
    int last = kDistanceBins - 1;
    const int min_p_last = min_p > 0.0f ? min(kDistanceBins - 1, static_cast<int>(-logf(min_p) * kBinsPerNat) + 1)
                                        : kDistanceBins - 1;
    if (top_k || top_p || min_p > 0.0f) {
      const double need_mass = static_cast<double>(job.top_p) * Z_mass + 1e-6 * Z_mass +
                               static_cast<double>(V);
      unsigned int count = 0;
      double mass = 0.0;
      for (int b = 0; b < kDistanceBins; ++b) {
        count += sh.hist_count[b];
        mass += static_cast<double>(sh.hist_mass[b]);
        const bool enough = top_k ? count >= static_cast<unsigned int>(job.top_k)
                                  : (top_p ? mass > need_mass : b >= min_p_last);
        if (enough || count == finite) {
          last = b;
          break;
        }
      }
    }
    unsigned int count = 0;
    for (int b = 0; b <= last; ++b) count += sh.hist_count[b];
    sh.count = count <= static_cast<unsigned int>(kCandidateCapacity) ? static_cast<int>(count) : -1;
    sh.sel_id = last;
  }
  __syncthreads();
  const int n_cand = sh.count;
  const int last_bin = sh.sel_id;
  __syncthreads();

  int token = -1, accepted = 0;
  float logprob = kNegInf, sum_smaller = 0.0f, prompt_lp = kNegInf;
  if (n_cand > 0) {
    // ---- Candidate path: the bins up to last_bin hold the kept set; sort them.
    if (threadIdx.x == 0) sh.count = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      const float s = scores(c);
      if (s == kNegInf) continue;
      const float d = (M - s) * kBinsPerNat;
      const int bin = d < static_cast<float>(kDistanceBins - 1) ? static_cast<int>(d) : kDistanceBins - 1;
      if (bin <= last_bin) {
        const int slot = atomicAdd(&sh.count, 1);
        sh.cand_id[slot] = c;
        sh.cand_s[slot] = s;
      }
    }
    __syncthreads();
    SortCandidates(sh, n_cand);
    // SPEC 3.6 top-p over the full softmax (Z), then 3.7 top-k, then 3.8 min-p.
    int kept = n_cand;
    PrefixSums(sh, n_cand, [&](int i) { return static_cast<double>(expf(sh.cand_s[i] - M)); });
    if (top_p) {
      if (threadIdx.x == 0) sh.count = n_cand;
      __syncthreads();
      const double limit = static_cast<double>(job.top_p);
      for (int i = threadIdx.x; i < n_cand; i += blockDim.x) {
        const double before = i > 0 ? sh.cum[i - 1] : 0.0;
        if (before / Z > limit) atomicMin(&sh.count, i);
      }
      __syncthreads();
      kept = sh.count;
      __syncthreads();
    }
    if (top_k) kept = min(kept, job.top_k);
    if (min_p > 0.0f) {
      if (threadIdx.x == 0) sh.count = kept;
      __syncthreads();
      for (int i = threadIdx.x; i < kept; i += blockDim.x) {
        if (i > 0 && expf(sh.cand_s[i] - M) < min_p) atomicMin(&sh.count, i);
      }
      __syncthreads();
      kept = sh.count;
      __syncthreads();
    }
    const double Zk = PrefixSums(sh, kept, [&](int i) { return static_cast<double>(expf(sh.cand_s[i] - M)); });
    const double log_zk = log(Zk);
    auto index_of = [&](int t) -> int {
      if (threadIdx.x == 0) sh.count = -1;
      __syncthreads();
      for (int i = threadIdx.x; i < kept; i += blockDim.x) {
        if (sh.cand_id[i] == t) sh.count = i;
      }
      __syncthreads();
      const int r = sh.count;
      __syncthreads();
      return r;
    };
    auto lp_at = [&](int i) {
      return static_cast<float>(static_cast<double>(sh.cand_s[i]) - M - log_zk);
    };
    if (prompt) {
      const int i = index_of(job.target);
      prompt_lp = i >= 0 ? lp_at(i) : kNegInf;
    } else {
      if (job.kind == kRowVerify && job.golden < 0) {
        const int d = job.draft_token;
        const int i = d >= 0 ? index_of(d) : -1;
        const double p_d = i >= 0 ? static_cast<double>(expf(sh.cand_s[i] - M)) / Zk : 0.0;
        const double q_d = d >= 0 ? exp(static_cast<double>(job.q_dense[d])) : 0.0;
        const double u = Uniform(job.seed, 3 * job.position + 2);
        accepted = d >= 0 && q_d > 0.0 && u < p_d / q_d;
        if (accepted) {
          token = d;
        } else {
          // Residual max(0, p - q) over the kept set, ordered by residual desc, id asc.
          for (int i = threadIdx.x; i < kept; i += blockDim.x) {
            const double r = static_cast<double>(expf(sh.cand_s[i] - M)) / Zk -
                             exp(static_cast<double>(job.q_dense[sh.cand_id[i]]));
            sh.cum[i] = r > 0.0 ? r : 0.0;
          }
          __syncthreads();
          // Reuse cand_s as the residual key (float image), keeping ids: sort, then prefix.
          for (int i = threadIdx.x; i < kept; i += blockDim.x) {
            const double r = sh.cum[i];
            sh.cand_s[i] = r > 0.0 ? static_cast<float>(r) : kNegInf;
          }
          __syncthreads();
          // Exact residual values travel with the sort through a parallel recomputation.
          SortCandidates(sh, kept);
          const double u_r = Uniform(job.seed, 3 * job.position + 1);
          int positive = 0;
          for (int i = threadIdx.x; i < kept; i += blockDim.x) positive += sh.cand_s[i] != kNegInf;
          positive = BlockReduce(positive, SumOp(), sh.scratch_i);
          if (positive > 0) {
            // Recompute the residual of each sorted entry from x (exact, as before sorting).
            const double total = PrefixSums(sh, positive, [&](int i) {
              const int c = sh.cand_id[i];
              const double r = static_cast<double>(expf(scores(c) - M)) / Zk -
                               exp(static_cast<double>(job.q_dense[c]));
              return r > 0.0 ? r : 0.0;
            });
            token = sh.cand_id[FirstExceeding(sh, positive, u_r * total)];
          } else {
            token = -2;  // residual empty: draw from p with u_r (below, after re-sorting)
          }
          // Restore the target order for the outputs below.
          if (threadIdx.x == 0) sh.count = 0;
          __syncthreads();
          for (int i = threadIdx.x; i < kept; i += blockDim.x) sh.cand_s[i] = scores(sh.cand_id[i]);
          __syncthreads();
          SortCandidates(sh, kept);
          PrefixSums(sh, kept, [&](int i) { return static_cast<double>(expf(sh.cand_s[i] - M)); });
          if (token == -2) token = sh.cand_id[FirstExceeding(sh, kept, u_r * Zk)];
        }
      } else if (job.golden >= 0) {
        token = job.golden;
        accepted = job.kind == kRowVerify && job.draft_token == job.golden;
      } else {
        const double u = Uniform(job.seed, 3 * job.position + 0);
        token = sh.cand_id[FirstExceeding(sh, kept, u * Zk)];
      }
      const int ti = index_of(token);
      logprob = ti >= 0 ? lp_at(ti) : kNegInf;
      if (job.want_sum_smaller && ti >= 0) {
        const float pivot = sh.cand_s[ti];
        double local = 0.0;
        for (int i = threadIdx.x; i < kept; i += blockDim.x) {
          const float s = sh.cand_s[i];
          if (s < pivot || (s == pivot && sh.cand_id[i] <= token)) local += expf(s - M);
        }
        sum_smaller = static_cast<float>(BlockReduce(local, SumOp(), sh.scratch_d) / Zk);
      }
      for (int i = threadIdx.x; i < job.top_logprobs; i += blockDim.x) {
        out.top_ids[i] = i < kept ? sh.cand_id[i] : -1;
        out.top_logprobs[i] = i < kept ? lp_at(i) : kNegInf;
      }
      if (job.pool_out != nullptr) {
        for (int c = threadIdx.x; c < V; c += blockDim.x) job.pool_out[c] = kNegInf;
        __syncthreads();
        for (int i = threadIdx.x; i < kept; i += blockDim.x) job.pool_out[sh.cand_id[i]] = lp_at(i);
      }
    }
  } else {
    // ---- Global path: radix selections over the whole row.
    uint32_t cut_key = 0;
    int cut_id = 0x7FFFFFFF;
    bool cut = false;
    auto s_key = [&](int c, uint32_t* k) {
      const float s = scores(c);
      *k = OrderKey(s);
      return s;
    };
    if (top_p) {
      // The last kept token under top-p: where the inclusive mass first exceeds top_p * Z.
      RadixSelect(sh, V,
                  [&](int c, uint32_t* k) -> unsigned long long {
                    const float s = s_key(c, k);
                    return s == kNegInf ? 0ull : ToMass(expf(s - M));
                  },
                  static_cast<unsigned long long>(static_cast<double>(job.top_p) * Z_mass));
      if (sh.sel_id >= 0) {
        cut = true;
        cut_key = sh.sel_key;
        cut_id = sh.sel_id;
      }
      __syncthreads();
    }
    if (top_k) {
      RadixSelect(sh, V,
                  [&](int c, uint32_t* k) -> unsigned long long {
                    const float s = s_key(c, k);
                    return s == kNegInf ? 0ull : 1ull;
                  },
                  static_cast<unsigned long long>(job.top_k - 1));
      if (sh.sel_id >= 0 && (!cut || AtOrBefore(sh.sel_key, sh.sel_id, cut_key, cut_id))) {
        cut = true;
        cut_key = sh.sel_key;
        cut_id = sh.sel_id;
      }
      __syncthreads();
    }
    auto kept_fn = [&](int c, float* s_out) {
      const float s = scores(c);
      *s_out = s;
      if (s == kNegInf) return false;
      if (cut && !AtOrBefore(OrderKey(s), c, cut_key, cut_id)) return false;
      if (min_p > 0.0f && expf(s - M) < min_p) return false;
      return true;
    };
    double zk_local = 0.0;
    unsigned long long zk_mass_local = 0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      float s;
      if (kept_fn(c, &s)) {
        const float e = expf(s - M);
        zk_local += e;
        zk_mass_local += ToMass(e);
      }
    }
    const double Zk = BlockReduce(zk_local, SumOp(), sh.scratch_d);
    const unsigned long long Zk_mass = BlockReduce(zk_mass_local, SumOp(), sh.scratch_u);
    const double log_zk = log(Zk);
    auto kept_mass = [&](int c, uint32_t* k) -> unsigned long long {
      float s;
      const bool kept = kept_fn(c, &s);
      *k = OrderKey(s);
      return kept ? ToMass(expf(s - M)) : 0ull;
    };
    auto lp_of = [&](int t) {
      float s;
      if (t < 0 || t >= V || !kept_fn(t, &s)) return kNegInf;
      return static_cast<float>(static_cast<double>(s) - M - log_zk);
    };
    if (prompt) {
      prompt_lp = lp_of(job.target);
    } else {
      if (job.kind == kRowVerify && job.golden < 0) {
        const int d = job.draft_token;
        float s_d = kNegInf;
        const bool d_kept = d >= 0 && kept_fn(d, &s_d);
        const double p_d = d_kept ? static_cast<double>(expf(s_d - M)) / Zk : 0.0;
        const double q_d = d >= 0 ? exp(static_cast<double>(job.q_dense[d])) : 0.0;
        accepted = d >= 0 && q_d > 0.0 && Uniform(job.seed, 3 * job.position + 2) < p_d / q_d;
        if (accepted) {
          token = d;
        } else {
          const double u_r = Uniform(job.seed, 3 * job.position + 1);
          auto residual = [&](int c, uint32_t* k) -> unsigned long long {
            float s;
            double r = 0.0;
            if (kept_fn(c, &s)) {
              r = static_cast<double>(expf(s - M)) / Zk - exp(static_cast<double>(job.q_dense[c]));
            }
            *k = OrderKey(r > 0.0 ? static_cast<float>(r) : 0.0f);
            return r > 0.0 ? ToMass(r) : 0ull;
          };
          unsigned long long r_local = 0;
          for (int c = threadIdx.x; c < V; c += blockDim.x) {
            uint32_t k;
            r_local += residual(c, &k);
          }
          const unsigned long long r_total = BlockReduce(r_local, SumOp(), sh.scratch_u);
          if (r_total > 0) {
            RadixSelect(sh, V, residual, static_cast<unsigned long long>(u_r * static_cast<double>(r_total)));
          } else {
            RadixSelect(sh, V, kept_mass, static_cast<unsigned long long>(u_r * static_cast<double>(Zk_mass)));
          }
          token = sh.sel_id;
          __syncthreads();
        }
      } else if (job.golden >= 0) {
        token = job.golden;
        accepted = job.kind == kRowVerify && job.draft_token == job.golden;
      } else {
        RadixSelect(sh, V, kept_mass,
                    static_cast<unsigned long long>(Uniform(job.seed, 3 * job.position) *
                                                    static_cast<double>(Zk_mass)));
        token = sh.sel_id;
        __syncthreads();
      }
      if (token < 0) {
        // Rounding left none: the last kept token.
        RadixSelect(sh, V, kept_mass, Zk_mass - 1);
        token = sh.sel_id;
        __syncthreads();
      }
      logprob = lp_of(token);
      if (job.want_sum_smaller) {
        float pivot;
        const bool t_kept = kept_fn(token, &pivot);
        double local = 0.0;
        if (t_kept) {
          for (int c = threadIdx.x; c < V; c += blockDim.x) {
            float s;
            if (kept_fn(c, &s) && (s < pivot || (s == pivot && c <= token))) local += expf(s - M);
          }
        }
        sum_smaller = static_cast<float>(BlockReduce(local, SumOp(), sh.scratch_d) / Zk);
      }
      // Top logprobs: the i-th kept element by count, one selection each (at most 64).
      for (int i = 0; i < job.top_logprobs; ++i) {
        RadixSelect(sh, V,
                    [&](int c, uint32_t* k) -> unsigned long long {
                      float s;
                      const bool kept = kept_fn(c, &s);
                      *k = OrderKey(s);
                      return kept ? 1ull : 0ull;
                    },
                    static_cast<unsigned long long>(i));
        if (threadIdx.x == 0) {
          out.top_ids[i] = sh.sel_id;
          out.top_logprobs[i] = sh.sel_id >= 0 ? lp_of(sh.sel_id) : kNegInf;
        }
        __syncthreads();
      }
      if (job.pool_out != nullptr) {
        for (int c = threadIdx.x; c < V; c += blockDim.x) job.pool_out[c] = lp_of(c);
      }
    }
  }
  if (threadIdx.x == 0) {
    out.token = token;
    out.accepted = accepted;
    out.logprob = logprob;
    out.sum_smaller = sum_smaller;
    out.prompt_logprob = prompt_lp;
  }
}

}  // namespace detail

const char* StepParams::Validate() const {
  if (logits == nullptr) return "logits is null";
  if (dtype < kF32 || dtype > kF16) return "dtype is not FLOAT32, BFLOAT16 or FLOAT16";
  if (vocab_size < 1) return "vocab_size must be >= 1";
  if (row_stride < vocab_size) return "row_stride is less than vocab_size";
  if (num_jobs < 0 || (num_jobs > 0 && jobs == nullptr)) return "jobs is null";
  if (num_penalties < 0 || (num_penalties > 0 && penalties == nullptr)) return "penalties is null";
  if (num_jobs > 0 && (workspace == nullptr || row_max == nullptr || results == nullptr)) {
    return "workspace, row_max and results are required";
  }
  return nullptr;
}

size_t StepParams::WorkspaceBytes(int32_t num_jobs, int32_t vocab_size) {
  return static_cast<size_t>(num_jobs) * vocab_size * sizeof(float) +
         static_cast<size_t>(num_jobs) * sizeof(unsigned int);
}

cudaError_t LaunchPrepareRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_jobs == 0) return cudaSuccess;
  const dim3 grid((params.vocab_size + detail::kPrepareChunk - 1) / detail::kPrepareChunk,
                  params.num_jobs);
  detail::PrepareRowsKernel<<<grid, detail::kPrepareThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t LaunchPenalties(const StepParams& params, cudaStream_t stream) {
  if (params.num_penalties == 0) return cudaSuccess;
  const int threads = 256;
  detail::PenaltiesKernel<<<(params.num_penalties + threads - 1) / threads, threads, 0, stream>>>(
      params);
  return cudaGetLastError();
}

cudaError_t LaunchSampleRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_jobs == 0) return cudaSuccess;
  detail::SampleRowsKernel<<<params.num_jobs, detail::kSampleThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace samplerd
