// Device code, private to cuda/: the general algorithm for one row job (radix selections over
// the whole row where candidates cannot hold the kept set, force top-N), which the general
// path runs for every row and the fused and split paths for rows they cannot finish.
#ifndef SAMPLERD_CUDA_KERNELS_GENERAL_CUH_
#define SAMPLERD_CUDA_KERNELS_GENERAL_CUH_

#include "cuda/kernels/finish.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// The general algorithm for row job j, from x (after steps 1-3) in the workspace and its max
// in row_max: radix selections over the whole row where the candidates cannot hold the kept
// set. Any block size that is a multiple of 32, up to 1024.
static __device__ void SampleRowGeneral(const StepParams& p, int j, Shared& sh) {
  const RowJob job = p.jobs[j];
  RowResult& out = p.results[j];
  const int V = p.vocab_size;
  const float* x = p.workspace + static_cast<int64_t>(j) * V;
  const bool prompt = job.kind == kRowPrompt;
  const bool has_penalties = job.update_end > job.update_begin;
  const int force_n = prompt ? 0 : job.force_top_n;
  RowScores scores{x, V, job.temperature, false, 0u, 0};
  // Issue 50: top-nσ and XTC (not on prompt rows), RAW logprobs. Top-nσ's cut is part of the
  // scores (RowScores::sigma_floor), so the histogram, Z and the candidates all see the kept
  // row; XTC acts in FinishCandidates as on the fast paths: both take the candidates where
  // they fit. RAW logprobs computed here need the whole-row selections.
  const bool sigma = !prompt && job.top_n_sigma > 0.0f;
  const bool xtc = !prompt && job.xtc != 0;
  // RAW logprobs here only where no RawLogprobsKernel follows (StepParams::raw_jobs).
  const bool raw = job.raw_logprobs != 0 && p.raw_jobs == nullptr;

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
  // Top-nσ (SPEC 3 step 4): over the finite x left by force top-N, their max M (x_max: force
  // keeps the largest), mean and population deviation in float64, two passes (as the CPU);
  // x < M - n * sigma is removed, so never the max.
  if (sigma) {
    double sum_local = 0.0;
    unsigned long long n_local = 0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      const float v = scores.Kept(c);
      if (v == kNegInf) continue;
      sum_local += v;
      ++n_local;
    }
    const double sum = BlockReduce(sum_local, SumOp(), sh.scratch_d);
    const unsigned long long n = BlockReduce(n_local, SumOp(), sh.scratch_u);
    const double mean = sum / static_cast<double>(n);
    double squares_local = 0.0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      const float v = scores.Kept(c);
      if (v == kNegInf) continue;
      const double d = static_cast<double>(v) - mean;
      squares_local += d * d;
    }
    const double squares = BlockReduce(squares_local, SumOp(), sh.scratch_d);
    scores.sigma_floor = static_cast<double>(x_max) -
                         static_cast<double>(job.top_n_sigma) * sqrt(squares / static_cast<double>(n));
  }
  // SPEC 3: a finite kept value that the temperature pushes out of float32 fails the row. Only
  // T < 1 can; force top-N and top-nσ decide which values are kept, so this pass follows them.
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
    sh.count = count <= static_cast<unsigned int>(kCandidateCapacity) && !raw
                   ? static_cast<int>(count)
                   : -1;
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
    FinishCandidates(sh, job, out, V, M, Z, n_cand, /*sorted=*/false);
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
      SelectTopKCut(sh, V, job.top_k, scores);
      if (sh.sel_id >= 0 && (!cut || AtOrBefore(sh.sel_key, sh.sel_id, cut_key, cut_id))) {
        cut = true;
        cut_key = sh.sel_key;
        cut_id = sh.sel_id;
      }
      __syncthreads();
    }
    // XTC's removal (SPEC 3 step 8): the kept tokens ranked at or before (head_key, head_id).
    bool head = false;
    uint32_t head_key = 0;
    int head_id = -1;
    auto kept_fn = [&](int c, float* s_out) {
      const float s = scores(c);
      *s_out = s;
      if (s == kNegInf) return false;
      if (cut && !AtOrBefore(OrderKey(s), c, cut_key, cut_id)) return false;
      if (min_p > 0.0f && MinPRemoves(expf(s - M), min_p)) return false;
      if (head && AtOrBefore(OrderKey(s), c, head_key, head_id)) return false;
      return true;
    };
    double Zk = 0.0;
    unsigned long long Zk_mass = 0;
    auto sum_kept = [&] {
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
      Zk = BlockReduce(zk_local, SumOp(), sh.scratch_d);
      Zk_mass = BlockReduce(zk_mass_local, SumOp(), sh.scratch_u);
    };
    sum_kept();
    if (xtc) {
      // The kept tokens with p >= threshold are a prefix of the kept order (p grows with s):
      // when there are two or more, every one but the last goes. The last removed one is the
      // (count - 1)-th kept element (0-based count - 2) by count.
      const double limit = static_cast<double>(job.xtc_threshold);
      unsigned long long above_local = 0;
      for (int c = threadIdx.x; c < V; c += blockDim.x) {
        float s;
        if (kept_fn(c, &s) && static_cast<double>(expf(s - M)) / Zk >= limit) ++above_local;
      }
      const unsigned long long above = BlockReduce(above_local, SumOp(), sh.scratch_u);
      if (above >= 2) {
        RadixSelect(sh, V,
                    [&](int c, uint32_t* k) -> unsigned long long {
                      float s;
                      const bool kept = kept_fn(c, &s);
                      *k = OrderKey(s);
                      return kept ? 1ull : 0ull;
                    },
                    above - 2);
        head = sh.sel_id >= 0;
        head_key = sh.sel_key;
        head_id = sh.sel_id;
        __syncthreads();
        if (head) sum_kept();
      }
    }
    const double log_zk = log(Zk);
    // SPEC 7's RAW mode: the logits as sent (columns < V), their max and log-sum-exp.
    float raw_max = kNegInf;
    double raw_log_sum = 0.0;
    if (raw) {
      float m_local = kNegInf;
      for (int c = threadIdx.x; c < V; c += blockDim.x) m_local = fmaxf(m_local, LoadLogitAt(p, job.logits_row, c));
      raw_max = BlockReduce(m_local, MaxOp(), sh.scratch_f);
      double z_local = 0.0;
      for (int c = threadIdx.x; c < V; c += blockDim.x) {
        z_local += expf(LoadLogitAt(p, job.logits_row, c) - raw_max);
      }
      raw_log_sum = log(BlockReduce(z_local, SumOp(), sh.scratch_d));
    }
    auto raw_lp = [&](int t) {
      if (t < 0 || t >= V) return kNegInf;
      return static_cast<float>(static_cast<double>(LoadLogitAt(p, job.logits_row, t)) -
                                static_cast<double>(raw_max) - raw_log_sum);
    };
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
      prompt_lp = raw ? raw_lp(job.target) : lp_of(job.target);
    } else {
      auto p_of = [&](int d) {
        float s_d = kNegInf;
        const bool d_kept = d >= 0 && kept_fn(d, &s_d);
        return d_kept ? static_cast<double>(expf(s_d - M)) / Zk : 0.0;
      };
      auto replace = [&](double u_r) {
        // Ordered by the float64 residual's own bits (a float image would tie residuals that
        // differ by less than float precision, as selection.cuh's SortCandidatesBy says).
        auto residual = [&](int c, uint64_t* k) -> unsigned long long {
          float s;
          double r = 0.0;
          if (kept_fn(c, &s)) {
            r = static_cast<double>(expf(s - M)) / Zk - exp(static_cast<double>(DraftLogprob(job, c)));
          }
          *k = r > 0.0 ? static_cast<uint64_t>(__double_as_longlong(r)) : 0ull;  // r >= 0: bits order
          return r > 0.0 ? ToMass(r) : 0ull;
        };
        unsigned long long r_local = 0;
        for (int c = threadIdx.x; c < V; c += blockDim.x) {
          uint64_t k;
          r_local += residual(c, &k);
        }
        const unsigned long long r_total = BlockReduce(r_local, SumOp(), sh.scratch_u);
        if (r_total > 0) {
          RadixSelect<uint64_t>(sh, V, residual,
                                static_cast<unsigned long long>(u_r * static_cast<double>(r_total)));
        } else {
          RadixSelect(sh, V, kept_mass, static_cast<unsigned long long>(u_r * static_cast<double>(Zk_mass)));
        }
        const int replacement = sh.sel_id;
        __syncthreads();
        return replacement;
      };
      auto draw = [&](double u) {
        RadixSelect(sh, V, kept_mass, static_cast<unsigned long long>(u * static_cast<double>(Zk_mass)));
        const int drawn = sh.sel_id;
        __syncthreads();
        return drawn;
      };
      token = ChooseToken(job, p_of, replace, draw, &accepted);
      if (token < 0) {
        // Rounding left none: the last kept token.
        RadixSelect(sh, V, kept_mass, Zk_mass - 1);
        token = sh.sel_id;
        __syncthreads();
      }
      logprob = raw ? raw_lp(token) : lp_of(token);
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
      // Top logprobs: the i-th kept element by count, one selection each (at most 64); in
      // RAW mode the i-th finite raw logit.
      for (int i = 0; i < job.top_logprobs; ++i) {
        if (raw) {
          RadixSelect(sh, V,
                      [&](int c, uint32_t* k) -> unsigned long long {
                        const float v = LoadLogitAt(p, job.logits_row, c);
                        *k = OrderKey(v);
                        return v == kNegInf ? 0ull : 1ull;
                      },
                      static_cast<unsigned long long>(i));
        } else {
          RadixSelect(sh, V,
                      [&](int c, uint32_t* k) -> unsigned long long {
                        float s;
                        const bool kept = kept_fn(c, &s);
                        *k = OrderKey(s);
                        return kept ? 1ull : 0ull;
                      },
                      static_cast<unsigned long long>(i));
        }
        if (threadIdx.x == 0) {
          out.top_ids[i] = sh.sel_id;
          out.top_logprobs[i] = sh.sel_id < 0 ? kNegInf : raw ? raw_lp(sh.sel_id) : lp_of(sh.sel_id);
        }
        __syncthreads();
      }
      if (job.pool_out != nullptr) {
        for (int c = threadIdx.x; c < V; c += blockDim.x) job.pool_out[c] = lp_of(c);
      }
    }
  }
  WriteRowOutputs(out, token, accepted, logprob, sum_smaller, prompt_lp);
}

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_KERNELS_GENERAL_CUH_
