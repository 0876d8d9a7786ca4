// samplerd's CUDA sampling kernels: SPEC sections 3-7 on device. See sampling_launch.h for
// the launch sequence and sampling_kernels.cuh for the conventions.
#include <cfloat>
#include <cmath>

#include <cooperative_groups.h>

#include "cuda/sampling_kernels.cuh"
#include "cuda/stage_probe.h"

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
    if (use_mask && !MaskAllows(job.mask, c)) v = kNegInf;
    x[c] = v;
    local_max = fmaxf(local_max, v);
  }
  __shared__ float scratch_f[32];
  __shared__ int scratch_i[32];
  local_max = BlockReduce(local_max, MaxOp(), scratch_f);
  bad = BlockReduce(bad, MaxOp(), scratch_i);
  if (threadIdx.x == 0) {
    if (bad) atomicOr(reinterpret_cast<int*>(&p.results[job_index].status), kRowNonFinite);
    atomicMax(&p.row_max[job_index], OrderKey(local_max));  // max is order-independent
  }
}

// SPEC 3 step 3 on one token: sampler/spec_rules.h's ApplyPenalty, as on the CPU.
__device__ __forceinline__ float ApplyPenaltyTerm(float v, const Penalty& pen) {
  return ApplyPenalty(v, pen.repetition, pen.presence, pen.frequency, pen.count);
}

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
  const float v = ApplyPenaltyTerm(x[pen.token], pen);
  if (LeftFloatRange(x[pen.token], v)) {
    atomicOr(reinterpret_cast<int*>(&p.results[lo].status), kRowOverflow);
  }
  x[pen.token] = v;
}

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
  // Whether the temperature pushes token c's finite, kept x out of the float32 range.
  __device__ bool Overflows(int c) const {
    const float v = x[c];
    if (v == kNegInf) return false;
    if (force) {
      const uint32_t k = OrderKey(v);
      if (!(k > n_key || (k == n_key && c <= n_id))) return false;
    }
    return isinf(v / T);
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

// Bitonic sort of sh.cand_* [0, n) by (cand_key desc, id asc), carrying cand_s; n is padded
// to a power of two with (-inf, INT_MAX) sentinels.
__device__ void SortCandidates(Shared& sh, int n) {
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += blockDim.x) {
    sh.cand_key[i] = kNegInf;
    sh.cand_s[i] = kNegInf;
    sh.cand_id[i] = 0x7FFFFFFF;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const float ki = sh.cand_key[i], kp = sh.cand_key[partner];
          const int ii = sh.cand_id[i], ip = sh.cand_id[partner];
          const bool i_first = ki > kp || (ki == kp && ii < ip);
          const bool best_first = (i & k) == 0;
          if (i_first != best_first) {
            sh.cand_key[i] = kp;
            sh.cand_key[partner] = ki;
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

// The rest of SPEC 3 and all of SPEC 5-7 for a row whose kept set (and top logprobs) lie in
// the candidates sh.cand_id/cand_s [0, n_cand), a prefix of the order: sort, top-p (over the
// full Z), top-k, min-p, log_softmax, then the draw or verification, and the outputs.
__device__ void FinishCandidates(Shared& sh, const RowJob& job, RowResult& out, int V, float M,
                                 double Z, int n_cand) {
  const bool prompt = job.kind == kRowPrompt;
  const bool top_k = job.top_k > 0 && job.top_k < V;
  const bool top_p = job.top_p < 1.0f;
  const float min_p = prompt ? 0.0f : job.min_p;
  for (int i = threadIdx.x; i < n_cand; i += blockDim.x) sh.cand_key[i] = sh.cand_s[i];
  __syncthreads();
  SortCandidates(sh, n_cand);
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
  int token = -1, accepted = 0;
  float logprob = kNegInf, sum_smaller = 0.0f, prompt_lp = kNegInf;
  if (prompt) {
    const int i = index_of(job.target);
    prompt_lp = i >= 0 ? lp_at(i) : kNegInf;
  } else {
    if (job.kind == kRowVerify && job.golden < 0) {
      const int d = job.draft_token;
      const int i = d >= 0 ? index_of(d) : -1;
      const double p_d = i >= 0 ? static_cast<double>(expf(sh.cand_s[i] - M)) / Zk : 0.0;
      const double q_d = d >= 0 ? exp(static_cast<double>(job.q_dense[d])) : 0.0;
      const double u = UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kAcceptReject));
      accepted = AcceptDraft(d, u, p_d, q_d);
      if (accepted) {
        token = d;
      } else {
        // Residual max(0, p - q) over the kept set, in the order (residual desc, id asc).
        auto residual = [&](int i) {
          const double r = static_cast<double>(expf(sh.cand_s[i] - M)) / Zk -
                           exp(static_cast<double>(job.q_dense[sh.cand_id[i]]));
          return r > 0.0 ? r : 0.0;
        };
        for (int i = threadIdx.x; i < kept; i += blockDim.x) {
          const double r = residual(i);
          sh.cand_key[i] = r > 0.0 ? static_cast<float>(r) : kNegInf;
        }
        __syncthreads();
        SortCandidates(sh, kept);
        int positive = 0;
        for (int i = threadIdx.x; i < kept; i += blockDim.x) positive += sh.cand_key[i] != kNegInf;
        positive = BlockReduce(positive, SumOp(), sh.scratch_i);
        const double u_r = UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kReplacement));
        if (positive > 0) {
          const double total = PrefixSums(sh, positive, residual);
          token = sh.cand_id[FirstExceeding(sh, positive, u_r * total)];
        }
        // Back to the target's order for the outputs (and for a draw from p).
        for (int i = threadIdx.x; i < kept; i += blockDim.x) sh.cand_key[i] = sh.cand_s[i];
        __syncthreads();
        SortCandidates(sh, kept);
        PrefixSums(sh, kept, [&](int i) { return static_cast<double>(expf(sh.cand_s[i] - M)); });
        if (positive == 0) token = sh.cand_id[FirstExceeding(sh, kept, u_r * Zk)];
      }
    } else if (job.golden >= 0) {
      token = job.golden;
      accepted = job.kind == kRowVerify && job.draft_token == job.golden;
    } else {
      const double u = UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kFresh));
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
  if (threadIdx.x == 0) {
    out.token = token;
    out.accepted = accepted;
    out.logprob = logprob;
    out.sum_smaller = sum_smaller;
    out.prompt_logprob = prompt_lp;
  }
}

// The general algorithm for row job j, from x (after steps 1-3) in the workspace and its max
// in row_max: radix selections over the whole row where the candidates cannot hold the kept
// set. Any block size that is a multiple of 32, up to 1024.
__device__ void SampleRowGeneral(const StepParams& p, int j, Shared& sh) {
  const RowJob job = p.jobs[j];
  RowResult& out = p.results[j];
  const int V = p.vocab_size;
  const float* x = p.workspace + static_cast<int64_t>(j) * V;
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
    if (threadIdx.x == 0) out.status = kRowNoToken;
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
  // SPEC 3: a finite kept value that the temperature pushes out of float32 fails the row. Only
  // T < 1 can; force top-N decides which values are kept, so this pass follows it.
  if (job.temperature < 1.0f) {
    int overflow = 0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) overflow |= scores.Overflows(c) ? 1 : 0;
    if (BlockReduce(overflow, OrOp(), sh.scratch_i)) {
      if (threadIdx.x == 0) out.status = kRowOverflow;
      return;
    }
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
    // ---- Candidate path: the bins up to last_bin hold the kept set.
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
    FinishCandidates(sh, job, out, V, M, Z, n_cand);
    return;
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
        accepted = AcceptDraft(
            d, UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kAcceptReject)), p_d,
            q_d);
        if (accepted) {
          token = d;
        } else {
          const double u_r = UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kReplacement));
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
                    static_cast<unsigned long long>(UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kFresh)) *
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



__global__ void __launch_bounds__(kSampleThreads) SampleRowsKernel(StepParams p) {
  __shared__ Shared sh;
  // A NaN / +inf found by the prepare kernel, or a penalty overflow by the penalties kernel.
  if (p.results[blockIdx.x].status != 0) return;
  SampleRowGeneral(p, blockIdx.x, sh);
}

// ---------------------------------------------------------------------------------------------
// The fused path: a cluster of kClusterBlocks blocks per row reads the row once into their
// shared memory and does every pass there; block 0 finishes from the candidates the cluster
// gathers through distributed shared memory. Rows it cannot finish this way (force top-N, or a
// kept set too wide for the candidate list) are written to the workspace and flagged (status
// 3) for SampleRowsKernel.

namespace cg = cooperative_groups;

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

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The benchmarks' stage probe (stage_probe.h): in the instrumented archive only. In production
// ProbeTimes() is a constant null and ProbeFlags() 0, so the stamps and switches compile away.
#if defined(SAMPLERD_STAGE_PROBE)
__constant__ StageProbe g_stage_probe;
__device__ __forceinline__ unsigned long long* ProbeTimes() { return g_stage_probe.stage_times; }
__device__ __forceinline__ int32_t ProbeFlags() { return g_stage_probe.flags; }
#else
__device__ __forceinline__ unsigned long long* ProbeTimes() { return nullptr; }
__device__ __forceinline__ int32_t ProbeFlags() { return 0; }
#endif

// Loads elements [lo, lo + n) of a job's logits row into xs (padding is never read) in one
// pass: NaN / +inf in a real column sets kRowNonFinite in *bad, the grammar mask (not for
// prompt rows) makes removed tokens -inf, *m is the max and *mn the least finite value (+inf
// if none); then the job's sparse penalties that fall in the chunk (one pushing a finite value
// out of float32 sets kRowOverflow), and the extremes again. Per-thread partials: the caller
// reduces *bad (or), *m and *mn over the block. Any block size.
__device__ void LoadChunk(const StepParams& p, const RowJob& job, const char* row, int lo, int n,
                          float* xs, int* bad_out, float* m_out, float* mn_out) {
  const bool use_mask = job.mask != nullptr && job.kind != kRowPrompt;
  int bad = 0;
  float m = kNegInf, mn = INFINITY;
  // x of token lo + i from its logit v (the mask, NaN / +inf, the max and the least finite
  // value on the way).
  auto admitted = [&](int i, float v) {
    bad |= !(v < INFINITY) ? kRowNonFinite : 0;
    const int c = lo + i;
    if (use_mask && !MaskAllows(job.mask, c)) v = kNegInf;
    m = fmaxf(m, v);
    mn = fminf(mn, v == kNegInf ? INFINITY : v);
    return v;
  };
  auto admit = [&](int i, float v) { xs[i] = admitted(i, v); };
  // 16-byte loads, and 16-byte stores into xs: four scalar stores a thread would hit the same
  // shared-memory banks four ways.
  const bool xs_aligned = reinterpret_cast<uintptr_t>(xs) % 16 == 0;
  const bool vector_f32 = p.dtype == kF32 && xs_aligned &&
                          (reinterpret_cast<uintptr_t>(row) % 16 == 0) && (lo % 4 == 0);
  if (vector_f32) {
    const float4* src = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(row) + lo);
    float4* dst = reinterpret_cast<float4*>(xs);
    const int n4 = n / 4;
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = src[i];
      dst[i] = make_float4(admitted(4 * i, v.x), admitted(4 * i + 1, v.y),
                           admitted(4 * i + 2, v.z), admitted(4 * i + 3, v.w));
    }
    for (int i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) {
      admit(i, reinterpret_cast<const float*>(row)[lo + i]);
    }
  } else if (p.dtype != kF32 && xs_aligned && (reinterpret_cast<uintptr_t>(row) % 16 == 0) &&
             (lo % 8 == 0)) {
    // 16-byte loads of eight bf16 / fp16 values.
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(static_cast<const void*>(row)) + 2 * static_cast<int64_t>(lo));
    float4* dst = reinterpret_cast<float4*>(xs);
    const int n8 = n / 8;
#pragma unroll 2
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
      const uint4 v = src[i];
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      float out[8];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint16_t lo16 = static_cast<uint16_t>(words[w] & 0xFFFFu);
        const uint16_t hi16 = static_cast<uint16_t>(words[w] >> 16);
        float a, b;
        if (p.dtype == kBF16) {
          a = __uint_as_float(static_cast<uint32_t>(lo16) << 16);
          b = __uint_as_float(static_cast<uint32_t>(hi16) << 16);
        } else {
          a = __half2float(__ushort_as_half(lo16));
          b = __half2float(__ushort_as_half(hi16));
        }
        out[2 * w] = admitted(8 * i + 2 * w, a);
        out[2 * w + 1] = admitted(8 * i + 2 * w + 1, b);
      }
      dst[2 * i] = make_float4(out[0], out[1], out[2], out[3]);
      dst[2 * i + 1] = make_float4(out[4], out[5], out[6], out[7]);
    }
    for (int i = 8 * n8 + threadIdx.x; i < n; i += blockDim.x) admit(i, LoadLogit(row, p.dtype, lo + i));
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) admit(i, LoadLogit(row, p.dtype, lo + i));
  }
  if (job.penalty_end > job.penalty_begin) {
    __syncthreads();
    for (int k = job.penalty_begin + threadIdx.x; k < job.penalty_end; k += blockDim.x) {
      const Penalty pen = p.penalties[k];
      if (pen.token < lo || pen.token >= lo + n) continue;
      const float before = xs[pen.token - lo];
      const float v = ApplyPenaltyTerm(before, pen);
      if (LeftFloatRange(before, v)) bad |= kRowOverflow;
      xs[pen.token - lo] = v;
    }
    __syncthreads();
    m = kNegInf;  // penalties move values: take the extremes again
    mn = INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xs[i];
      m = fmaxf(m, v);
      mn = fminf(mn, v == kNegInf ? INFINITY : v);
    }
  }
  *bad_out = bad;
  *m_out = m;
  *mn_out = mn;
}

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kClusterThreads, 2)
    ClusterSampleKernel(StepParams p, int chunk) {
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
  const int elem = p.dtype == kF32 ? 4 : 2;
  const char* row = static_cast<const char*>(p.logits) +
                    static_cast<int64_t>(job.logits_row) * p.row_stride * elem;
  const bool prompt = job.kind == kRowPrompt;

  // Load the chunk once (padding is never read), checking NaN/+inf, applying the grammar mask
  // and taking the max in the same pass; then the sparse penalties.
  int bad = 0;
  float m = kNegInf, mn = INFINITY;
  auto load_chunk = [&]() { LoadChunk(p, job, row, lo, n, xs, &bad, &m, &mn); };
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
  // Force top-N rows go to the general algorithm, which checks the temperature itself.
  const bool force = !prompt && job.force_top_n > 0 && job.force_top_n < V;
  const int32_t fault = RowFault(any_bad, x_min, x_max, job.temperature, !force);
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
  const float scale = 1.4426950408889634f / T;
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
    fallback(false);
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
    fallback(false);
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
  FinishCandidates(sh, job, out, V, M, Z, total);
  __syncthreads();
  stage(6);
}


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
constexpr int kSplitMaxChunks = 64;   // SplitPathEligible keeps chunks * top_k <= 2048

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

cudaError_t SetStageProbe(const StageProbe& probe) {
#if defined(SAMPLERD_STAGE_PROBE)
  return cudaMemcpyToSymbol(detail::g_stage_probe, &probe, sizeof(probe));
#else
  (void)probe;
  return cudaErrorNotSupported;  // the production kernels carry no probe
#endif
}

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
  if (num_split < 0 || (num_split > 0 && (split_jobs == nullptr || split_scratch == nullptr))) {
    return "split_jobs and split_scratch are required";
  }
  if (num_split > 0 && (vocab_size + kSplitChunk - 1) / kSplitChunk > detail::kSplitMaxChunks) {
    return "vocab_size has too many chunks for the split path";
  }
  if (num_fused < 0 || (num_fused > 0 && fused_jobs == nullptr)) return "fused_jobs is null";
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

int FusedChunk(int32_t vocab_size) {
  const int per_block = (vocab_size + detail::kClusterBlocks - 1) / detail::kClusterBlocks;
  return (per_block + 7) / 8 * 8;
}

bool FusedPathFits(int32_t vocab_size) {
  return static_cast<size_t>(FusedChunk(vocab_size)) * sizeof(float) <= detail::kMaxFusedChunkBytes;
}

cudaError_t LaunchFusedRows(const StepParams& params, cudaStream_t stream) {
  const int jobs = params.fused_jobs != nullptr ? params.num_fused : params.num_jobs;
  if (jobs == 0) return cudaSuccess;
  const int chunk = FusedChunk(params.vocab_size);
  const size_t smem = static_cast<size_t>(chunk) * sizeof(float);
  cudaError_t error = cudaFuncSetAttribute(detail::ClusterSampleKernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
  if (error != cudaSuccess) return error;
  detail::ClusterSampleKernel<<<jobs * detail::kClusterBlocks, detail::kClusterThreads, smem,
                                stream>>>(params, chunk);
  return cudaGetLastError();
}

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

cudaError_t LaunchSampleRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_jobs == 0) return cudaSuccess;
  detail::SampleRowsKernel<<<params.num_jobs, detail::kSampleThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace samplerd
