// Device code, private to cuda/: finishing a row from its candidates, the one place of the
// kept-set cuts (SPEC 3 steps 6-9: top-p, top-k, min-p, log_softmax), the draw (5), the
// verification (6) and the outputs (7) that the fused and split paths end in.
#ifndef SAMPLERD_CUDA_KERNELS_FINISH_CUH_
#define SAMPLERD_CUDA_KERNELS_FINISH_CUH_

#include "cuda/kernels/row_prologue.cuh"
#include "cuda/kernels/selection.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// SPEC 5-6's choice of a sampled row's token, the one skeleton both ways of finishing a row
// (from candidates, and the general algorithm's selections over the whole row) fill in:
// a golden token is taken (accepted when it is the verified draft); a verified draft is
// accepted when U < p(d) / q(d), else replaced from the residual; otherwise a fresh draw.
// `p_of(d)`: the target's processed probability of token d (0 when d is -1 or not kept);
// `replace(u)` and `draw(u)`: the token for the uniform u. Block-uniform: every thread calls
// it, and the callbacks may synchronize.
template <typename POf, typename Replace, typename Draw>
__device__ __forceinline__ int ChooseToken(const RowJob& job, POf p_of, Replace replace,
                                           Draw draw, int* accepted) {
  if (job.kind == kRowVerify && job.golden < 0) {
    const int d = job.draft_token;
    const double p_d = p_of(d);
    const double q_d = d >= 0 ? exp(static_cast<double>(DraftLogprob(job, d))) : 0.0;
    const double u = UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kAcceptReject));
    *accepted = AcceptDraft(d, u, p_d, q_d);
    if (*accepted) return d;
    return replace(UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kReplacement)));
  }
  if (job.golden >= 0) {
    *accepted = job.kind == kRowVerify && job.draft_token == job.golden;
    return job.golden;
  }
  return draw(UniformDouble(job.seed, SequenceNumber(job.position, DrawCase::kFresh)));
}

// A row's scalar outputs (the top logprobs and pool row are written where they are computed).
__device__ __forceinline__ void WriteRowOutputs(RowResult& out, int token, int accepted,
                                                float logprob, float sum_smaller,
                                                float prompt_lp) {
  if (threadIdx.x == 0) {
    out.token = token;
    out.accepted = accepted;
    out.logprob = logprob;
    out.sum_smaller = sum_smaller;
    out.prompt_logprob = prompt_lp;
  }
}

// The rest of SPEC 3 and all of SPEC 5-7 for a row whose kept set (and top logprobs) lie in
// the candidates sh.cand_id/cand_s [0, n_cand), a prefix of the order: sort (unless `sorted`:
// the caller placed them in order), top-p (over the full Z), top-k, min-p, XTC, log_softmax,
// then the draw or verification, and the outputs.
static __device__ void FinishCandidates(Shared& sh, const RowJob& job, RowResult& out, int V, float M,
                                        double Z, int n_cand, bool sorted) {
  const bool prompt = job.kind == kRowPrompt;
  const bool top_k = job.top_k > 0 && job.top_k < V;
  const bool top_p = job.top_p < 1.0f;
  const float min_p = prompt ? 0.0f : job.min_p;
  for (int i = threadIdx.x; i < n_cand; i += blockDim.x) sh.cand_key[i] = sh.cand_s[i];
  __syncthreads();
  if (!sorted) SortCandidates(sh, n_cand);
  int kept = n_cand;
  auto weight = [&](int i) { return static_cast<double>(expf(sh.cand_s[i] - M)); };
  PrefixSums(sh, n_cand, weight);
  if (top_p) {
    kept = FirstWhere(sh, n_cand, [&](int i) {
      return TopPRemoves(i > 0 ? sh.cum[i - 1] : 0.0, Z, job.top_p);
    });
  }
  if (top_k) kept = min(kept, job.top_k);
  if (min_p > 0.0f) {
    kept = FirstWhere(sh, kept, [&](int i) { return i > 0 && MinPRemoves(expf(sh.cand_s[i] - M), min_p); });
  }
  double Zk = PrefixSums(sh, kept, weight);
  if (!prompt && job.xtc != 0) {
    // XTC (SPEC 3 step 8; the host drew it and it fired): the kept tokens with p >= the
    // threshold are a prefix of the kept order (p falls along it); when there are two or
    // more, all but the last of them go: the kept set starts at that last one.
    const double limit = static_cast<double>(job.xtc_threshold);
    const int drop = FirstWhere(sh, kept, [&](int i) { return !(weight(i) / Zk >= limit); }) - 1;
    if (drop >= 1) {
      kept -= drop;
      // Shifted down through cand_key and cum's storage (both rewritten below before use).
      int* ids = reinterpret_cast<int*>(sh.cum);
      for (int i = threadIdx.x; i < kept; i += blockDim.x) {
        sh.cand_key[i] = sh.cand_s[i + drop];
        ids[i] = sh.cand_id[i + drop];
      }
      __syncthreads();
      for (int i = threadIdx.x; i < kept; i += blockDim.x) {
        sh.cand_s[i] = sh.cand_key[i];
        sh.cand_id[i] = ids[i];
      }
      __syncthreads();
      // The survivors weighed against their own max (the rest below reads M through `weight`
      // and lp_at): against the row's, one far below it weighs a subnormal float or 0 (threshold
      // 0 keeps only the least likely token), and its logprob came out off 0 or the sum 0. The
      // CPU backend rebases the same way (RowProcessor::RebaseKept).
      M = sh.cand_s[0];
      Zk = PrefixSums(sh, kept, weight);
    }
  }
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
    auto p_of = [&](int d) {
      const int i = d >= 0 ? index_of(d) : -1;
      return i >= 0 ? static_cast<double>(expf(sh.cand_s[i] - M)) / Zk : 0.0;
    };
    auto replace = [&](double u_r) {
      // Residual max(0, p - q) over the kept set, in the order (residual desc, id asc).
      auto residual = [&](int i) {
        const double r = static_cast<double>(expf(sh.cand_s[i] - M)) / Zk -
                         exp(static_cast<double>(DraftLogprob(job, sh.cand_id[i])));
        return r > 0.0 ? r : 0.0;
      };
      // Sorted by the float64 residual itself (sh.cum until PrefixSums overwrites it).
      for (int i = threadIdx.x; i < kept; i += blockDim.x) {
        const double r = residual(i);
        sh.cum[i] = r > 0.0 ? r : -INFINITY;
      }
      __syncthreads();
      SortCandidatesBy(sh, kept, sh.cum);
      int positive = 0;
      for (int i = threadIdx.x; i < kept; i += blockDim.x) positive += sh.cum[i] != -INFINITY;
      positive = BlockReduce(positive, SumOp(), sh.scratch_i);
      int replacement = -1;
      if (positive > 0) {
        const double total = PrefixSums(sh, positive, residual);
        replacement = sh.cand_id[FirstExceeding(sh, positive, u_r * total)];
      }
      // Back to the target's order for the outputs (and for a draw from p).
      for (int i = threadIdx.x; i < kept; i += blockDim.x) sh.cand_key[i] = sh.cand_s[i];
      __syncthreads();
      SortCandidates(sh, kept);
      PrefixSums(sh, kept, weight);
      if (positive == 0) replacement = sh.cand_id[FirstExceeding(sh, kept, u_r * Zk)];
      return replacement;
    };
    auto draw = [&](double u) { return sh.cand_id[FirstExceeding(sh, kept, u * Zk)]; };
    token = ChooseToken(job, p_of, replace, draw, &accepted);
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
  WriteRowOutputs(out, token, accepted, logprob, sum_smaller, prompt_lp);
}

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_KERNELS_FINISH_CUH_
