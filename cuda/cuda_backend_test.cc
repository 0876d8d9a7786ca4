// The CUDA backend against the CPU backend on the same random inputs, over every feature
// (SPEC 8: tokens identical except within 1e-6 of an interval edge, processed logprobs within
// 1e-5), plus bitwise repeatability and batch invariance on the GPU. Tagged `gpu`.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <atomic>
#include <mutex>
#include <gmock/gmock.h>

#include "cuda/cuda_status.h"
#include "cuda/launch_probe.h"
#include "cuda/sampling_launch.h"
#include "sampler/validate.h"
#include "sampler/backend_compare.h"
#include "sampler/cpu_backend.h"
#include "sampler/draft_rule_cases.h"
#include "sampler/dtype.h"
#include "sampler/reference_sampler.h"
#include "sampler/spec_rules.h"
#include "sampler/test_util.h"

namespace samplerd {
namespace {

// A CUDA backend of `lanes` lanes (CudaBackendOptions::streams).
std::unique_ptr<CudaBackend> Gpu(int lanes = CudaBackendOptions{}.streams) {
  CudaBackendOptions options;
  options.streams = lanes;
  auto gpu = CudaBackend::Create(options);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  return gpu.ok() ? std::move(*gpu) : nullptr;
}

// The next `count` launches (one per launch of jobs, on whichever lane) fail with a real CUDA
// error (cudaErrorInvalidValue) after their inputs were queued, as issue 25's failed launch
// did: a launch probe (cuda/launch_probe.h), so production launches carry no test hook.
class FailingLaunches final : public cuda::LaunchProbe {
 public:
  explicit FailingLaunches(int count) : left_(count) {}
  absl::Status BeforeLaunch(cudaStream_t) override { return absl::OkStatus(); }
  absl::Status AfterStep(bool) override { return absl::OkStatus(); }
  absl::Status AtLaunch(cudaStream_t stream) override {
    if (left_.fetch_sub(1) <= 0) return absl::OkStatus();
    return CudaStatus(cudaMemsetAsync(nullptr, 0, 16, stream), "cudaMemsetAsync");
  }

 private:
  std::atomic<int> left_;
};

void FailNextLaunches(CudaBackend& gpu, int count) {
  gpu.set_launch_probe(std::make_shared<FailingLaunches>(count));
}

// Two results bitwise alike: statuses, tokens, accept counts, every logprob's bits.
bool BitwiseSame(const StepResult& a, const StepResult& b) {
  if (a.results.size() != b.results.size()) return false;
  for (size_t i = 0; i < a.results.size(); ++i) {
    const RequestResult& x = a.results[i];
    const RequestResult& y = b.results[i];
    if (x.status != y.status || x.num_accepted != y.num_accepted || x.token_ids != y.token_ids ||
        x.logprobs.size() != y.logprobs.size() ||
        std::memcmp(x.logprobs.data(), y.logprobs.data(), x.logprobs.size() * 4) != 0 ||
        x.sum_smaller_probs.size() != y.sum_smaller_probs.size() ||
        std::memcmp(x.sum_smaller_probs.data(), y.sum_smaller_probs.data(),
                    x.sum_smaller_probs.size() * 4) != 0 ||
        x.top_logprobs.size() != y.top_logprobs.size()) {
      return false;
    }
    for (size_t t = 0; t < x.top_logprobs.size(); ++t) {
      if (x.top_logprobs[t].token_ids != y.top_logprobs[t].token_ids ||
          std::memcmp(x.top_logprobs[t].logprobs.data(), y.top_logprobs[t].logprobs.data(),
                      x.top_logprobs[t].logprobs.size() * 4) != 0) {
        return false;
      }
    }
  }
  return true;
}

std::unique_ptr<CpuBackend> Cpu() {
  auto cpu = CpuBackend::Create({});
  return std::move(*cpu);
}

StepResult RunStep(Backend& backend, const Step& step) {
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{9}; });
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto result = backend.Sample(*plan);
  EXPECT_TRUE(result.ok()) << result.status();
  return std::move(*result);
}

std::vector<SamplingParams> ParamSets() {
  std::vector<SamplingParams> sets;
  SamplingParams p;
  sets.push_back(p);                                  // full vocabulary
  p.temperature = 0.7f; p.top_p = 0.95f; p.top_k = 50; p.top_logprobs = 5;
  sets.push_back(p);                                  // the benchmark's
  p = {}; p.top_p = 0.9f; p.temperature = 1.2f; sets.push_back(p);   // top-p alone
  p = {}; p.top_k = 300; p.top_logprobs = 64; sets.push_back(p);      // large top-k
  p = {}; p.min_p = 0.05f; p.top_logprobs = 3; sets.push_back(p);     // min-p alone
  p = {}; p.temperature = 0.0f; sets.push_back(p);                    // "greedy"
  p = {}; p.repetition_penalty = 1.3f; p.presence_penalty = 0.5f; p.frequency_penalty = -0.3f;
  p.top_k = 20; sets.push_back(p);                                    // penalties
  p = {}; p.temperature = 0.8f; p.top_k = 50; p.top_logprobs = 4;     // token adjustments
  p.logit_bias = {{1, 2.0f}, {5, -1.0f}, {30, 100.0f}, {36, -100.0f}};
  p.bad_words = {{3}, {7, 9}};
  p.min_tokens = 5;
  p.stop_token_ids = {0, 2};
  sets.push_back(p);
  return sets;
}

Step PrefillStep(const HostLogits& logits, int32_t vocab, int rows, uint64_t seed,
                 const SamplingParams& params, int32_t force_top_n, bool masks,
                 std::vector<std::string>* mask_storage) {
  Step step = MakeStep(StepKind::kPrefill, logits, vocab);
  step.force_top_n = force_top_n;
  step.compute_sum_smaller_probs = true;
  std::mt19937_64 rng(seed);
  for (int r = 0; r < rows; ++r) {
    RequestInputs req = PrefillRequest("r" + std::to_string(r), r, seed * 1000 + r, 50 + r);
    req.params = params;
    req.params.seq_seed = seed * 1000 + r;
    req.prompt_token_ids = {static_cast<int32_t>(rng() % vocab), static_cast<int32_t>(rng() % vocab)};
    req.output_token_ids = {static_cast<int32_t>(rng() % vocab), static_cast<int32_t>(rng() % vocab),
                            static_cast<int32_t>(rng() % vocab)};
    if (masks && r % 2 == 0) {
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab; ++t) {
        if (rng() % 3 != 0) allowed.push_back(t);
      }
      mask_storage->push_back(MaskOf(vocab, allowed));
    }
    step.requests.push_back(req);
  }
  if (masks) {
    size_t m = 0;
    for (int r = 0; r < rows; r += 2) step.requests[r].allowed_token_masks = {(*mask_storage)[m++]};
  }
  return step;
}

TEST(CudaBackend, PrefillMatchesCpuOverEveryFeature) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  uint64_t seed = 1;
  for (int32_t vocab : {37, 1000, 32000, 129280}) {
    for (const SamplingParams& params : ParamSets()) {
      for (int32_t force : {0, 64}) {
        for (bool masks : {false, true}) {
          const int rows = vocab > 50000 ? 4 : 8;
          HostLogits logits(rows, vocab + 5, seed, 2.5f);
          for (int r = 0; r < rows; ++r) {
            for (int c = vocab; c < vocab + 5; ++c) logits.Row(r)[c] = std::nanf("");
          }
          std::vector<std::string> mask_storage;
          mask_storage.reserve(rows);
          const Step step = PrefillStep(logits, vocab, rows, seed, params,
                                        force < vocab ? force : 0, masks, &mask_storage);
          CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally,
                  "V=" + std::to_string(vocab) + " seed=" + std::to_string(seed), step);
          ++seed;
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  std::printf("prefill: %d requests, %d boundary-band tokens, %d logprobs compared\n", tally.requests,
              tally.token_mismatches, tally.compared_logprobs);
  // Each differing token was checked against SPEC 8's band in Compare.
}

// Issue 50: top-nσ, XTC and RAW logprobs, alone and mixed with the other parameters, force
// top-N and grammar masks: top-nσ on the fused path (and its general fallback after the cut),
// XTC on the fused and split paths, RAW logprobs and force top-N on the general algorithm, all
// of them on the three-kernel path (V = 400,000); prompt logprobs in RAW mode; DECODE rows
// verifying against XTC's distribution. Both backends agree (tokens, or SPEC 8's band;
// logprobs to 1e-5).
std::vector<SamplingParams> Issue50ParamSets() {
  std::vector<SamplingParams> sets;
  SamplingParams p;
  p.top_n_sigma = 1.0f; p.temperature = 0.8f; p.top_logprobs = 5; sets.push_back(p);
  p = {}; p.top_n_sigma = 2.5f; p.top_k = 50; p.top_p = 0.9f; p.top_logprobs = 2; sets.push_back(p);
  p = {}; p.xtc_probability = 1.0f; p.temperature = 0.3f; p.top_logprobs = 3; sets.push_back(p);
  p = {}; p.xtc_probability = 0.5f; p.xtc_threshold = 0.05f; p.top_k = 20; p.temperature = 0.5f;
  sets.push_back(p);
  p = {}; p.logprobs_mode = 1; p.top_logprobs = 8; p.temperature = 0.7f; p.top_k = 50;
  p.repetition_penalty = 1.2f; sets.push_back(p);
  p = {}; p.top_n_sigma = 1.5f; p.xtc_probability = 1.0f; p.xtc_threshold = 0.08f;
  p.logprobs_mode = 1; p.min_p = 0.02f; p.temperature = 0.6f; p.top_logprobs = 4; sets.push_back(p);
  // A wide top-nσ (about half the row kept): the fused path's candidates overflow after the
  // cut, and its general fallback must cut the reloaded row itself.
  p = {}; p.top_n_sigma = 4.0f; p.top_p = 0.95f; p.top_logprobs = 3; sets.push_back(p);
  // XTC under top-p and min-p on the split path (top-k 40), and top-nσ with a penalty.
  p = {}; p.xtc_probability = 1.0f; p.xtc_threshold = 0.02f; p.top_k = 40; p.top_p = 0.95f;
  p.min_p = 0.01f; p.top_logprobs = 6; sets.push_back(p);
  p = {}; p.top_n_sigma = 0.7f; p.presence_penalty = 0.5f; p.repetition_penalty = 1.3f;
  p.top_logprobs = 2; sets.push_back(p);
  return sets;
}

TEST(CudaBackend, TopNSigmaXtcAndRawLogprobsMatchCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  uint64_t seed = 7000;
  for (int32_t vocab : {1000, 32000, 129280, 400000}) {
    for (const SamplingParams& params : Issue50ParamSets()) {
      for (int32_t force : {0, 64}) {
        const bool masks = force == 0 && vocab < 100000;
        const int rows = vocab > 50000 ? 3 : 8;
        HostLogits logits(rows, vocab, seed, vocab == 1000 ? 3.5f : 2.5f);
        std::vector<std::string> mask_storage;
        mask_storage.reserve(rows);
        const Step step = PrefillStep(logits, vocab, rows, seed, params, force, masks, &mask_storage);
        CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally,
                       "issue 50 V=" + std::to_string(vocab) + " seed=" + std::to_string(seed), step);
        ++seed;
        if (HasFatalFailure()) return;
      }
    }
  }
  // Prompt logprobs in RAW mode (bfloat16 logits, as a worker sends them), beside a processed one.
  {
    const int32_t vocab = 32000;
    HostLogits f32(8, vocab, 77, 2.0f);
    std::vector<uint16_t> bf16(f32.values.size());
    for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = FloatToBFloat16(f32.values[i]);
    Step step = MakeStep(StepKind::kPrefill, f32, vocab);
    step.logits.data = bf16.data();
    step.logits.dtype = DType::kBFloat16;
    for (int i = 0; i < 2; ++i) {
      RequestInputs r;
      r.request_id = "p" + std::to_string(i);
      r.row = 4 * i + 3;
      r.params.seq_seed = 90 + i;
      r.params.temperature = 0.7f;
      r.params.top_k = 100;
      r.params.top_logprobs = 3;
      r.params.logprobs_mode = i;
      r.prompt_first_row = 4 * i;
      r.prompt_targets = {5, 6, 7};
      step.requests.push_back(r);
    }
    CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally, "raw prompt logprobs", step);
  }
  // DECODE: drafts near the target, so that some are accepted under XTC's distribution.
  for (int set : {1, 2, 3, 4, 5, 7}) {
    const int32_t vocab = 32000, requests = 4, q = 3;
    HostLogits target(requests * q, vocab, 300 + set, 3.0f);
    HostLogits drafts(requests * (q - 1), vocab, 400 + set, 1.0f);
    std::vector<std::vector<int32_t>> ids(requests);
    for (int i = 0; i < requests; ++i) {
      for (int j = 0; j < q - 1; ++j) {
        float* row = drafts.Row(i * (q - 1) + j);
        const float* t = target.Row(i * q + j);
        for (int32_t c = 0; c < vocab; ++c) row[c] = t[c] + 0.3f * row[c];
        const float m = *std::max_element(row, row + vocab);
        double z = 0.0;
        for (int32_t c = 0; c < vocab; ++c) z += std::exp(static_cast<double>(row[c] - m));
        for (int32_t c = 0; c < vocab; ++c) row[c] = row[c] - m - static_cast<float>(std::log(z));
        ids[i].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row) + j);
      }
    }
    Step step = MakeStep(StepKind::kDecode, target, vocab);
    step.compute_sum_smaller_probs = true;
    for (int i = 0; i < requests; ++i) {
      RequestInputs r = DecodeRequest("r" + std::to_string(i), i * q, q, 0, 40 + i);
      r.params = Issue50ParamSets()[set];
      r.params.seq_seed = 600 + 10 * set + i;
      r.draft_token_ids = ids[i];
      r.drafts.form = DraftDistributions::Form::kDense;
      r.drafts.values = drafts.RowsView(i * (q - 1), q - 1);
      step.requests.push_back(r);
    }
    CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally,
                   "issue 50 DECODE set " + std::to_string(set), step);
  }
  std::printf("issue 50: %d requests, %d boundary-band tokens, %d logprobs compared\n",
              tally.requests, tally.token_mismatches, tally.compared_logprobs);
}

// XTC at threshold 0 keeps only the least likely kept token: its logprob is log(1) = 0 however
// far below the row's max it lies. Weighed against that max in float, a survivor 88-103 below
// is a subnormal (its logprob came out up to ~0.3 off 0) and one 104 or more below weighs 0
// (the kept sum 0, its log -inf). Each row: the max at token 5, the survivor `gap` below it at
// token 9, the rest -inf; on the fused path (top-k 2, V = 32,000), the general one (top-k off)
// and the three-kernel one (V = 400,000).
TEST(CudaBackend, XtcAtThresholdZeroWeighsTheSurvivorAgainstItself) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  const std::vector<float> gaps = {10.0f, 88.0f, 95.0f, 103.0f, 110.0f, 1000.0f};
  const int rows = static_cast<int>(gaps.size());
  CompareTally tally;
  for (int32_t vocab : {32000, 400000}) {
    for (int32_t top_k : {2, -1}) {
      HostLogits logits(rows, vocab);
      for (float& v : logits.values) v = -INFINITY;
      for (int r = 0; r < rows; ++r) {
        logits.Row(r)[5] = 0.0f;
        logits.Row(r)[9] = -gaps[r];
      }
      Step step = MakeStep(StepKind::kPrefill, logits, vocab);
      for (int r = 0; r < rows; ++r) {
        RequestInputs q = PrefillRequest("x" + std::to_string(r), r, 11 + r);
        q.params.xtc_probability = 1.0f;
        q.params.xtc_threshold = 0.0f;
        q.params.top_k = top_k;
        q.params.top_logprobs = 2;
        step.requests.push_back(q);
      }
      const StepResult got = RunStep(*gpu, step);
      const std::string where =
          "V=" + std::to_string(vocab) + " top_k=" + std::to_string(top_k);
      for (int r = 0; r < rows; ++r) {
        const RequestResult& res = got.results[r];
        ASSERT_TRUE(res.status.ok()) << where << " gap " << gaps[r] << ": " << res.status;
        EXPECT_EQ(res.token_ids, std::vector<int32_t>{9}) << where << " gap " << gaps[r];
        EXPECT_EQ(res.logprobs, std::vector<float>{0.0f}) << where << " gap " << gaps[r];
        ASSERT_EQ(res.top_logprobs.size(), 1u);
        EXPECT_EQ(res.top_logprobs[0].token_ids, (std::vector<int32_t>{9, -1})) << where;
        EXPECT_EQ(res.top_logprobs[0].logprobs[0], 0.0f) << where << " gap " << gaps[r];
      }
      CompareWithCpu(RunStep(*cpu, step), got, tally, "xtc threshold 0 " + where, step);
    }
  }
}

// Issue 50 on the fast paths, small enough for compute-sanitizer. SPEC 3 step 4's cut at the
// population deviation: finite values [4, 2.5, 2, 0] spread over V = 32,000 (the rest -inf),
// n = 1: M - σ = 2.569 removes 2.5, which a sample deviation (M - 1.652 = 2.348) would keep.
// Then top-nσ (the fused path, whatever the top-k) and XTC (split and fused paths), narrow and
// wide cuts, over random masked rows, against the CPU.
TEST(CudaBackend, TopNSigmaAndXtcOnTheFastPaths) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  const int32_t vocab = 32000;
  {
    HostLogits logits(2, vocab);
    for (float& v : logits.values) v = -INFINITY;
    const float finite[] = {4.0f, 2.5f, 2.0f, 0.0f};
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 4; ++i) logits.Row(r)[9000 * i + 7 * r] = finite[i];
    }
    Step step = MakeStep(StepKind::kPrefill, logits, vocab);
    for (int r = 0; r < 2; ++r) {
      RequestInputs q = PrefillRequest("s" + std::to_string(r), r, 5 + r);
      q.params.top_n_sigma = 1.0f;
      q.params.top_logprobs = 3;
      q.params.top_k = r == 0 ? -1 : 20;
      step.requests.push_back(q);
    }
    const StepResult got = RunStep(*gpu, step);
    for (int r = 0; r < 2; ++r) {
      const RequestResult& res = got.results[r];
      ASSERT_TRUE(res.status.ok()) << res.status;
      ASSERT_EQ(res.token_ids, std::vector<int32_t>{7 * r});
      ASSERT_EQ(res.top_logprobs.size(), 1u);
      EXPECT_EQ(res.top_logprobs[0].token_ids, (std::vector<int32_t>{7 * r, -1, -1})) << r;
      EXPECT_EQ(res.logprobs, std::vector<float>{0.0f});
    }
  }
  CompareTally tally;
  uint64_t seed = 9100;
  SamplingParams a;
  a.top_n_sigma = 1.0f; a.temperature = 0.8f; a.top_k = 50; a.top_p = 0.95f; a.top_logprobs = 5;
  SamplingParams b;
  b.xtc_probability = 1.0f; b.xtc_threshold = 0.05f; b.top_k = 50; b.top_p = 0.95f;
  b.temperature = 0.7f; b.top_logprobs = 5;
  SamplingParams c = b;
  c.top_k = 200;  // the fused path
  SamplingParams d = a;
  d.top_n_sigma = 3.0f;  // thousands kept
  SamplingParams e = b;
  e.top_n_sigma = 1.5f;  // both
  e.top_k = 30;
  SamplingParams f = a;
  f.top_k = -1;
  for (const SamplingParams& params : {a, b, c, d, e, f}) {
    HostLogits logits(6, vocab, seed, 3.0f);
    std::vector<std::string> masks;
    masks.reserve(6);
    const Step step = PrefillStep(logits, vocab, 6, seed, params, 0, true, &masks);
    CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally,
                   "fast paths seed=" + std::to_string(seed), step);
    ++seed;
  }
}

// SPEC 7's RAW logprobs on the fast paths (RawLogprobsKernel after the split and fused paths),
// small enough for compute-sanitizer. Rows built for each way its top entries are found:
// random rows (the band within a few nats of the raw max), a flat row (every token tied: the
// cluster's radix selection, ties in id order across its blocks), a lone max over a dense band
// of 6,000 equal values (the band overflows the candidate list: radix selection with the ties
// cut inside the band), bfloat16 logits (many exact ties); with a grammar mask, penalties and
// a bias (the raw values ignore them), on the split path (top-k 50), the fused path (top-k
// 400, none) and the fused path's general fallback (force top-N), top_logprobs 1 to 64, and
// DECODE verification rows. Against the CPU, then the flat row's ids checked outright.
TEST(CudaBackend, RawLogprobsOnTheFastPathsMatchCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  const int32_t vocab = 32000;
  uint64_t seed = 9300;
  for (int shape = 0; shape < 4; ++shape) {
    for (int32_t top_k : {50, 400, -1}) {
      for (int32_t force : {0, 64}) {
        const int rows = 6;
        HostLogits logits(rows, vocab, seed, 3.0f);
        if (shape == 1) {
          for (float& v : logits.values) v = 0.0f;
        } else if (shape == 2) {
          for (int r = 0; r < rows; ++r) {
            float* row = logits.Row(r);
            for (int32_t c = 0; c < vocab; ++c) row[c] = -30.0f;
            for (int32_t c = 0; c < 6000; ++c) row[(c * 5 + r) % vocab] = -3.0f;
            row[(17 * r + 3) % vocab] = 9.0f;  // the lone max, far above the band
          }
        }
        SamplingParams params;
        params.logprobs_mode = 1;
        params.top_k = top_k;
        params.temperature = 0.9f;
        params.top_p = shape == 1 ? 1.0f : 0.95f;
        params.top_logprobs = (shape * 3 + (top_k > 0 ? top_k : 7)) % 64 + 1;
        params.repetition_penalty = 1.2f;
        params.logit_bias = {{11, 3.0f}, {12, -2.0f}};
        std::vector<std::string> masks;
        masks.reserve(rows);
        Step step = PrefillStep(logits, vocab, rows, seed, params, force, force == 0, &masks);
        std::vector<uint16_t> bf16;
        if (shape == 3) {
          bf16.resize(logits.values.size());
          for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = FloatToBFloat16(logits.values[i]);
          step.logits.data = bf16.data();
          step.logits.dtype = DType::kBFloat16;
        }
        const StepResult want = RunStep(*cpu, step);
        const StepResult got = RunStep(*gpu, step);
        CompareWithCpu(want, got, tally,
                       "raw shape=" + std::to_string(shape) + " top_k=" + std::to_string(top_k) +
                           " force=" + std::to_string(force),
                       step);
        {
          // The compare lets ranks of equal logprobs swap; SPEC 7 orders them by id: row 1's
          // top ids against a stable sort of its values as sent.
          const RequestResult& res = got.results[1];
          ASSERT_TRUE(res.status.ok()) << res.status;
          ASSERT_EQ(res.top_logprobs.size(), 1u);
          std::vector<float> sent(logits.Row(1), logits.Row(1) + vocab);
          if (shape == 3) {
            for (int32_t c = 0; c < vocab; ++c) sent[c] = BFloat16ToFloat(bf16[vocab + c]);
          }
          std::vector<int32_t> order(vocab);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int32_t a, int32_t b) { return sent[a] > sent[b]; });
          for (int i = 0; i < params.top_logprobs; ++i) {
            EXPECT_EQ(res.top_logprobs[0].token_ids[i], order[i]) << "rank " << i;
          }
          if (shape == 1) {  // every raw logit 0: each log(1 / V)
            EXPECT_FLOAT_EQ(res.top_logprobs[0].logprobs[0], -std::log(static_cast<float>(vocab)));
          }
        }
        ++seed;
        if (HasFatalFailure()) return;
      }
    }
  }
  std::printf("raw logprobs: %d requests, %d boundary-band tokens, %d logprobs compared\n",
              tally.requests, tally.token_mismatches, tally.compared_logprobs);
}

// Random token adjustments as an OpenAI-style server sends them (64 bias entries, 4 bad words
// of which some the history completes, min_tokens with stop ids, sometimes allowed ids, with
// and without grammar masks and penalties) on PREFILL and DECODE steps: both backends agree.
TEST(CudaBackend, RandomTokenAdjustmentsMatchCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  std::mt19937_64 rng(77);
  auto token = [&](int32_t vocab) { return static_cast<int32_t>(rng() % vocab); };
  auto adjust = [&](SamplingParams& p, int32_t vocab, const std::vector<int32_t>& history) {
    for (int i = 0; i < 64; ++i) {
      const float bias = i % 16 == 0 ? 100.0f : static_cast<float>(static_cast<int>(rng() % 1001) - 500) / 100.0f;
      p.logit_bias.emplace_back(token(vocab), bias);
    }
    std::sort(p.logit_bias.begin(), p.logit_bias.end());
    p.logit_bias.erase(std::unique(p.logit_bias.begin(), p.logit_bias.end(),
                                   [](const auto& a, const auto& b) { return a.first == b.first; }),
                       p.logit_bias.end());
    for (int w = 0; w < 4; ++w) {
      const size_t length = 1 + rng() % 3;
      std::vector<int32_t> word;
      if (rng() % 2 == 0 && history.size() + 1 >= length) {  // completed by the history
        word.assign(history.end() - static_cast<ptrdiff_t>(length - 1), history.end());
      } else {
        for (size_t k = 0; k + 1 < length; ++k) word.push_back(token(vocab));
      }
      word.push_back(token(vocab));
      p.bad_words.push_back(word);
    }
    p.min_tokens = static_cast<int32_t>(rng() % 8);
    p.stop_token_ids = {token(vocab), token(vocab)};
    if (rng() % 4 == 0) {
      for (int i = 0; i < 200; ++i) p.allowed_token_ids.push_back(token(vocab));
    }
  };
  // DRY on half the requests (issue 33): a prompt of a 6-token pattern repeated, an output that
  // starts it again, so the context ends in a repeat that DRY penalises.
  auto dry = [&](RequestInputs& r, int32_t vocab) {
    if (rng() % 2 == 0) return;
    std::vector<int32_t> pattern;
    for (int k = 0; k < 6; ++k) pattern.push_back(token(vocab));
    r.prompt_token_ids.clear();
    for (int k = 0; k < 20; ++k) {
      r.prompt_token_ids.insert(r.prompt_token_ids.end(), pattern.begin(), pattern.end());
    }
    r.output_token_ids.assign(pattern.begin(), pattern.begin() + 3);
    r.params.dry_multiplier = 0.8f;
    r.params.dry_base = 1.75f;
    r.params.dry_sequence_breakers = {token(vocab)};
    r.params.dry_range = rng() % 2 == 0 ? 0 : 64;
  };
  for (int32_t vocab : {1000, 129280}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const int rows = 16;
      HostLogits logits(rows, vocab, 300 + seed, 2.5f);
      std::vector<SamplingParams> sets = ParamSets();
      std::vector<std::string> mask_storage;
      mask_storage.reserve(rows);
      Step step = PrefillStep(logits, vocab, rows, seed + 50, sets[seed % sets.size()], 0,
                              /*masks=*/seed % 2 == 1, &mask_storage);
      for (RequestInputs& r : step.requests) {
        dry(r, vocab);
        adjust(r.params, vocab, r.output_token_ids);
        if (rng() % 4 == 0) {
          // A repetition penalty over a 600-token prompt: more updates than the split path
          // lists, so its chunks take the staging way (UpdateChunkValues).
          r.prompt_token_ids.clear();
          for (int k = 0; k < 600; ++k) r.prompt_token_ids.push_back(token(vocab));
          r.params.repetition_penalty = 1.3f;
        }
      }
      CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally,
              "prefill V=" + std::to_string(vocab) + " seed=" + std::to_string(seed), step);
      if (HasFatalFailure()) return;

      // DECODE, q = 4, dense drafts near the target, so drafts are accepted and complete words.
      const int requests = 4, q = 4;
      HostLogits q_rows(requests * (q - 1), vocab);
      for (int r = 0; r < requests * (q - 1); ++r) {
        const float uniform = -std::log(static_cast<float>(vocab));
        std::fill(q_rows.Row(r), q_rows.Row(r) + vocab, uniform);
      }
      Step decode = MakeStep(StepKind::kDecode, logits, vocab);
      for (int i = 0; i < requests; ++i) {
        RequestInputs d = DecodeRequest("d" + std::to_string(i), i * q, q, seed * 100 + i, 31 + i);
        d.params.top_k = 40;
        d.params.top_logprobs = 3;
        d.output_token_ids = {token(vocab), token(vocab)};
        dry(d, vocab);
        for (int j = 0; j + 1 < q; ++j) {
          // The target row's argmax: accepted with high probability.
          const float* row = logits.Row(i * q + j);
          d.draft_token_ids.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
        }
        std::vector<int32_t> history = d.output_token_ids;
        history.insert(history.end(), d.draft_token_ids.begin(), d.draft_token_ids.end());
        adjust(d.params, vocab, history);
        d.drafts.form = DraftDistributions::Form::kDense;
        d.drafts.values = q_rows.RowsView(i * (q - 1), q - 1);
        decode.requests.push_back(d);
      }
      CompareWithCpu(RunStep(*cpu, decode), RunStep(*gpu, decode), tally,
              "decode V=" + std::to_string(vocab) + " seed=" + std::to_string(seed), decode);
      if (HasFatalFailure()) return;
    }
  }
  std::printf("token adjustments: %d requests, %d boundary-band tokens, %d logprobs compared\n",
              tally.requests, tally.token_mismatches, tally.compared_logprobs);
}

TEST(CudaBackend, VocabularyTooWideForTheFusedPathMatchesCpu) {
  // 400,000 columns do not fit a cluster's shared memory: the three-kernel path runs.
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  const int32_t vocab = 400000;
  HostLogits logits(3, vocab, 91, 2.5f);
  std::vector<std::string> masks;
  masks.reserve(3);
  int k = 0;
  for (const SamplingParams& params : ParamSets()) {
    const Step step = PrefillStep(logits, vocab, 3, 500 + k++, params, 0, true, &masks);
    CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally, "V=400000", step);
    masks.clear();
  }
  std::printf("V=400000: %d requests, %d boundary-band tokens\n", tally.requests,
              tally.token_mismatches);
}

TEST(CudaBackend, Bf16Fp16PromptLogprobsGoldenAndNanMatchCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  const int32_t vocab = 32000, prompt = 40;
  HostLogits logits(prompt + 3, vocab, 77, 2.0f);
  logits.Row(prompt + 2)[17] = std::nanf("");  // request 2's sampled row
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> half(logits.values.size());
    Step step = MakeStep(StepKind::kPrefill, logits, vocab);
    if (dtype != DType::kFloat32) {
      for (size_t i = 0; i < half.size(); ++i) {
        half[i] = dtype == DType::kBFloat16 ? FloatToBFloat16(logits.values[i]) : FloatToHalf(logits.values[i]);
      }
      step.logits.dtype = dtype;
      step.logits.data = half.data();
    }
    RequestInputs a = PrefillRequest("a", prompt, 5);
    a.prompt_first_row = 0;
    for (int k = 0; k < prompt; ++k) a.prompt_targets.push_back((k * 131) % vocab);
    a.params.temperature = 0.8f;
    a.params.top_p = 0.9f;
    a.params.top_k = 100;  // the fused path; the split path's prompt rows: the test below
    RequestInputs b = PrefillRequest("b", prompt + 1, 6);
    b.golden_token_ids = {1234};
    b.params.top_logprobs = 4;
    RequestInputs c = PrefillRequest("c", prompt + 2, 7);
    step.requests = {a, b, c};
    const StepResult on_cpu = RunStep(*cpu, step);
    const StepResult on_gpu = RunStep(*gpu, step);
    CompareWithCpu(on_cpu, on_gpu, tally, std::string("dtype ") + DTypeName(dtype), step);
    EXPECT_EQ(on_gpu.results[1].token_ids, std::vector<int32_t>{1234});
    EXPECT_EQ(on_gpu.results[2].status.code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(tally.token_mismatches, 0);
}

// The split path (top_k <= 64) on rows that stress its candidate lists: all-equal logits and
// heavy ties (chunks overflow: the finisher selects the top K from the whole row), a block of tokens
// tied at the max across chunk boundaries, prompt logprobs, masks and penalties, fp32 and
// bf16, V = 129,280 (16 chunks) and 8,200 (a last chunk of 8 tokens).
// Rows that stress the split path: row 0 flat, row 1 heavy ties (values 0-2), row 2 a tied
// block at the max (every 97th token 9.0), row 6 (of more than 6) flat but for spikes in its
// first chunk, the rest random.
HostLogits SplitEdgeLogits(int rows, int32_t vocab) {
  HostLogits logits(rows, vocab, 31, 2.0f);
  std::mt19937_64 rng(5);
  for (int32_t c = 0; c < vocab; ++c) {
    logits.Row(0)[c] = 0.0f;                                        // flat
    logits.Row(1)[c] = static_cast<float>(rng() % 3);               // heavy ties
    if (c % 97 == 0) logits.Row(2)[c] = 9.0f;                       // a tied block at the max
    // Flat after its first chunk, 63 spikes in it: its later chunks overflow, and the row's
    // top K (from the whole row) lies in the first; a kernel that listed against a bound from
    // earlier chunks would not overflow there and must answer the same bits.
    if (rows > 6) logits.Row(6)[c] = c < cuda::kSplitChunk && c % 131 == 0 ? 5.0f : 0.0f;
  }
  return logits;
}

// A PREFILL step over SplitEdgeLogits: `rows` sampled rows (T 0.7, top_p 0.95, 0.5 on row 3,
// `top_k`; a grammar mask on row 4, penalties on row 5) and `prompt` - 1 prompt rows after
// them. `half`: the logits as bf16 (null: fp32). The masks live in *masks.
Step SplitEdgeStep(const HostLogits& logits, const std::vector<uint16_t>* half, int32_t vocab,
                   int rows, int prompt, int32_t top_k, std::vector<std::string>* masks) {
  Step step = MakeStep(StepKind::kPrefill, logits, vocab);
  step.compute_sum_smaller_probs = true;
  if (half != nullptr) {
    step.logits.dtype = DType::kBFloat16;
    step.logits.data = half->data();
  }
  masks->reserve(rows);
  for (int r = 0; r < rows; ++r) {
    RequestInputs req = PrefillRequest("r" + std::to_string(r), r, 60 + r + top_k, 9);
    req.params.temperature = 0.7f;
    req.params.top_p = r == 3 ? 0.5f : 0.95f;
    req.params.top_k = top_k;
    req.params.top_logprobs = std::min(top_k, 5);
    if (r == 4) {
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab; t += 3) allowed.push_back(t);
      masks->push_back(MaskOf(vocab, allowed));
      req.allowed_token_masks = {masks->back()};
    }
    if (r == 5) {
      req.params.repetition_penalty = 1.5f;
      req.params.presence_penalty = 1.0f;
      req.output_token_ids = {1, 8199, 8192, 8191, 100};
    }
    step.requests.push_back(req);
  }
  RequestInputs p = PrefillRequest("p", rows + prompt - 1, 3);
  p.prompt_first_row = rows;
  for (int k = 0; k < prompt - 1; ++k) p.prompt_targets.push_back((k * 4099) % vocab);
  p.params.temperature = 0.9f;
  p.params.top_k = top_k;
  step.requests.push_back(p);
  return step;
}

TEST(CudaBackend, SplitPathTiesOverflowAndPromptRowsMatchCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  for (int32_t vocab : {8200, 129280}) {
    const int rows = 6, prompt = 5;
    const HostLogits logits = SplitEdgeLogits(rows + prompt, vocab);
    std::vector<uint16_t> half(logits.values.size());
    for (size_t i = 0; i < half.size(); ++i) half[i] = FloatToBFloat16(logits.values[i]);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int32_t top_k : {1, 10, 64}) {
        std::vector<std::string> masks;
        const Step step = SplitEdgeStep(logits, dtype == DType::kBFloat16 ? &half : nullptr,
                                        vocab, rows, prompt, top_k, &masks);
        CompareWithCpu(RunStep(*cpu, step), RunStep(*gpu, step), tally,
                "V=" + std::to_string(vocab) + " top_k=" + std::to_string(top_k) + " " +
                    DTypeName(dtype),
                step);
        if (HasFatalFailure()) return;
      }
    }
  }
  std::printf("split path: %d requests, %d token mismatches, %d logprobs compared\n",
              tally.requests, tally.token_mismatches, tally.compared_logprobs);
}

// Runs `step` on the chunk blocks and on the streaming kernel (each forced), expects the two
// bitwise equal and the streaming kernel's within SPEC 8 of the CPU.
class SplitStreamComparison {
 public:
  SplitStreamComparison() : gpu_(Gpu()), cpu_(Cpu()) {}
  bool ok() const { return gpu_ != nullptr; }
  void Both(const Step& step, const std::string& what) {
    gpu_->set_split_stream_rows(std::numeric_limits<int>::max());
    const StepResult chunks = RunStep(*gpu_, step);
    gpu_->set_split_stream_rows(1);
    const StepResult stream = RunStep(*gpu_, step);
    gpu_->set_split_stream_rows(cuda::kSplitStreamRows);
    EXPECT_TRUE(BitwiseSame(chunks, stream)) << what;
    CompareWithCpu(RunStep(*cpu_, step), stream, tally_, what, step);
    ++steps_;
  }
  // SplitEdgeStep's rows at V = vocab: flat rows, heavy ties, a tied block at the max, a mask,
  // penalties (rows with updates stage nothing), prompt rows, a bias on the last token; fp32
  // and bf16, top_k 1 and 50.
  void EdgeRows(int32_t vocab) {
    const int rows = 8, prompt = 4;
    const HostLogits logits = SplitEdgeLogits(rows + prompt, vocab);
    std::vector<uint16_t> half(logits.values.size());
    for (size_t i = 0; i < half.size(); ++i) half[i] = FloatToBFloat16(logits.values[i]);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int32_t top_k : {1, 50}) {
        std::vector<std::string> masks;
        Step step = SplitEdgeStep(logits, dtype == DType::kBFloat16 ? &half : nullptr, vocab,
                                  rows, prompt, top_k, &masks);
        // A bias on the row's last token too (the partial last chunk at V = 8,200).
        step.requests[5].params.logit_bias = {{7, 3.0f}, {vocab - 1, 50.0f}};
        Both(step, "V=" + std::to_string(vocab) + " top_k=" + std::to_string(top_k) + " " +
                       DTypeName(dtype));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  ~SplitStreamComparison() {
    std::printf("split stream: %d steps, %d requests, %d boundary-band tokens\n", steps_,
                tally_.requests, tally_.token_mismatches);
  }

 private:
  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<CpuBackend> cpu_;
  CompareTally tally_;
  int steps_ = 0;
};

// The streaming split kernel (a block a row over its chunks, the next chunk staged by
// cp.async, no barrier between chunks) computes each chunk exactly as a chunk block does, so
// its results must equal the chunk blocks' bit for bit. Here at V = 8,200 (two chunks, the
// last partial): small enough for compute-sanitizer's racecheck (scripts/gpu_mps.sh check),
// which is what checks the chunks' shared state without a barrier between them.
TEST(CudaBackend, SplitStreamKernelEqualsTheChunkBlocksOnTwoChunks) {
  SplitStreamComparison compare;
  ASSERT_TRUE(compare.ok());
  compare.EdgeRows(8200);
}

// Seven chunks (V = 49,160, the last partial): the streaming kernel's shared state past its
// first reuse by parity (chunks 2-6 write what chunks 0-4 wrote), in a size that racecheck
// finishes (scripts/gpu_mps.sh check).
TEST(CudaBackend, SplitStreamKernelEqualsTheChunkBlocksOnSevenChunks) {
  SplitStreamComparison compare;
  ASSERT_TRUE(compare.ok());
  compare.EdgeRows(6 * cuda::kSplitChunk + 8);
}

// The same at V = 129,280 and 129,283 (rows at addresses not 16-byte aligned load directly),
// and DECODE with drafts under the benchmark's parameters.
TEST(CudaBackend, SplitStreamKernelEqualsTheChunkBlocksBitForBit) {
  SplitStreamComparison compare;
  ASSERT_TRUE(compare.ok());
  for (int32_t vocab : {129280, 129283}) {
    compare.EdgeRows(vocab);
    if (HasFatalFailure()) return;
  }
  // DECODE with dense drafts, the benchmark's parameters, R = 64 x 4.
  const int32_t vocab = 129280;
  const int requests = 64, q = 4;
  HostLogits logits(requests * q, vocab, 43, 2.0f);
  HostLogits q_rows(requests * (q - 1), vocab, 44, 2.0f);
  Step decode = MakeStep(StepKind::kDecode, logits, vocab);
  for (int i = 0; i < requests; ++i) {
    RequestInputs d = DecodeRequest("d" + std::to_string(i), i * q, q, 500 + i, 31 + i);
    d.params.temperature = 0.7f;
    d.params.top_p = 0.95f;
    d.params.top_k = 50;
    d.params.top_logprobs = 5;
    for (int j = 0; j + 1 < q; ++j) {
      const float* row = logits.Row(i * q + j);
      d.draft_token_ids.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    d.drafts.form = DraftDistributions::Form::kDense;
    d.drafts.values = q_rows.RowsView(i * (q - 1), q - 1);
    decode.requests.push_back(d);
  }
  compare.Both(decode, "decode 64x4");
}

TEST(CudaBackend, DecodeAndDraftMatchCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  CompareTally tally;
  const int32_t requests = 6, q = 4;
  int rejections = 0;
  // Two shapes: V = 32,000 with top-k 40, and the production one (issue 27): V = 129,280, no
  // top-k, top_p = 1, where a rejected draft's residual is positive on tens of thousands of
  // tokens (the CPU draws it by buckets past 4,096). Until issue 34 seed 0's DRAFT step drew
  // one token 5e-6 from the edge in the float64 reference: the CPU's full-vocabulary draw
  // ordered two tokens of equal float weight but different scores by id, not by score
  // (row_processor_test's EqualWeightsOfDifferentScoresDrawInScoreOrder).
  for (int shape = 0; shape < 2; ++shape) {
  const int32_t vocab = shape == 0 ? 32000 : 129280;
  for (int form = 0; form < 3; ++form) {  // dense, top-N, pool
    for (uint64_t seed = 0; seed < 3; ++seed) {
      HostLogits target(requests * q, vocab, 100 + seed, 2.0f);
      HostLogits draft_logits(requests * (q - 1), vocab, 200 + seed, 2.0f);
      // Drafts resemble the target, so some are accepted.
      for (size_t i = 0; i < draft_logits.values.size(); ++i) {
        const int r = static_cast<int>(i / vocab), c = static_cast<int>(i % vocab);
        const int req = r / (q - 1), j = r % (q - 1);
        draft_logits.values[i] = target.Row(req * q + j)[c] + 0.5f * draft_logits.values[i] / 2.0f;
      }
      SamplingParams params;
      params.temperature = shape == 0 ? 0.9f : 1.0f;
      if (shape == 0) params.top_k = 40;
      params.top_p = shape == 0 ? 0.95f : 1.0f;
      params.top_logprobs = 2;
      // The draft model's processed distributions: a DRAFT step on each backend (pool form), or
      // sent as dense / top-N rows taken from the CPU's DRAFT answer's pool entries.
      Step draft = MakeStep(StepKind::kDraft, draft_logits, vocab);
      for (int i = 0; i < requests; ++i) {
        RequestInputs d;
        d.request_id = "r" + std::to_string(i);
        for (int j = 0; j < q - 1; ++j) {
          d.rows.push_back(i * (q - 1) + j);
          d.draft_indices.push_back(j + 1);
        }
        d.params = params;
        d.params.seq_seed = seed * 10 + i;
        d.sample_position = 70;
        draft.requests.push_back(d);
      }
      const StepResult cpu_draft = RunStep(*cpu, draft);
      const StepResult gpu_draft = RunStep(*gpu, draft);
      CompareWithCpu(cpu_draft, gpu_draft, tally, "draft", draft);
      std::vector<HostLogits> dense;
      std::vector<HostLogits> topn_values;
      std::vector<std::vector<int32_t>> topn_ids(requests);
      dense.reserve(requests);
      topn_values.reserve(requests);
      if (form != 2) {
        auto entries = std::vector<DraftPool::Entry>();
        for (int i = 0; i < requests; ++i) {
          auto e = cpu->draft_pool().Take(DraftPoolKey("", "r" + std::to_string(i)));
          ASSERT_TRUE(e.ok());
          dense.emplace_back(q - 1, vocab);
          topn_values.emplace_back(q - 1, 8);
          for (int j = 0; j < q - 1; ++j) {
            const std::vector<float>& lp = e->at(j + 1).logprobs;
            std::copy(lp.begin(), lp.end(), dense.back().Row(j));
            std::vector<int32_t> ids(vocab);
            for (int32_t t = 0; t < vocab; ++t) ids[t] = t;
            std::partial_sort(ids.begin(), ids.begin() + 8, ids.end(),
                              [&](int32_t x, int32_t y) { return lp[x] > lp[y] || (lp[x] == lp[y] && x < y); });
            for (int k = 0; k < 8; ++k) {
              topn_values.back().Row(j)[k] = lp[ids[k]];
              topn_ids[i].push_back(ids[k]);
            }
          }
          gpu->draft_pool().Release(DraftPoolKey("", "r" + std::to_string(i)));
        }
      }
      Step decode = MakeStep(StepKind::kDecode, target, vocab);
      decode.compute_sum_smaller_probs = true;
      for (int i = 0; i < requests; ++i) {
        RequestInputs r = DecodeRequest("r" + std::to_string(i), i * q, q, 0, 71);
        r.params = params;
        r.params.seq_seed = seed * 10 + i;
        r.draft_token_ids = cpu_draft.results[i].token_ids;
        r.output_token_ids = {1, 2, 3};
        if (form == 0) {
          r.drafts.form = DraftDistributions::Form::kDense;
          r.drafts.values = dense[i].View();
        } else if (form == 1) {
          r.drafts.form = DraftDistributions::Form::kTopN;
          r.drafts.values = topn_values[i].View();
          r.drafts.token_ids = topn_ids[i];
        }
        decode.requests.push_back(r);
      }
      const StepResult cpu_decode = RunStep(*cpu, decode);
      for (const RequestResult& r : cpu_decode.results) rejections += r.num_accepted < q - 1;
      CompareWithCpu(cpu_decode, RunStep(*gpu, decode), tally,
              "decode V=" + std::to_string(vocab) + " form " + std::to_string(form) + " seed " +
                  std::to_string(seed), decode);
      if (HasFatalFailure()) return;
    }
  }
  }
  std::printf("decode/draft: %d requests, %d token mismatches, %d decode requests with a "
              "rejection\n", tally.requests, tally.token_mismatches, rejections);
  EXPECT_GT(rejections, 0);
}

// The CUDA pool keeps DRAFT rows in device memory (V rounded up to 32 floats each): a pool of
// three rows admits a request of two, fails the next request that would need a fourth
// (RESOURCE_EXHAUSTED, and its partial allocation is returned), and gives every row back when
// DECODE consumes it or Release drops it: 50 DRAFT/DECODE cycles of three rows run in a pool
// of exactly three. DECODE from the device pool matches the CPU backend's DECODE from its own.
TEST(CudaBackend, DraftPoolLivesOnTheDevice) {
  const int32_t vocab = 1000, row_elements = 1024;
  CudaBackendOptions options;
  // Three rows of device memory, and the bookkeeping of three rows and two entries.
  const int64_t row_bytes = row_elements * 4 + kRowOverheadBytes;
  const int64_t entry_bytes = kEntryOverheadBytes + DraftPoolKey("", "p0").size();
  options.draft_pool.capacity_bytes = 3 * row_bytes + 2 * entry_bytes;
  auto created = CudaBackend::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  CudaBackend& gpu = **created;
  auto cpu = Cpu();
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 20;
  auto draft_step = [&](std::vector<int> rows_per_request, const HostLogits& logits) {
    Step step = MakeStep(StepKind::kDraft, logits, vocab);
    int row = 0;
    for (size_t i = 0; i < rows_per_request.size(); ++i) {
      RequestInputs d;
      d.request_id = "p" + std::to_string(i);
      for (int j = 0; j < rows_per_request[i]; ++j) {
        d.rows.push_back(row++);
        d.draft_indices.push_back(j + 1);
      }
      d.params = params;
      d.params.seq_seed = 40 + i;
      d.sample_position = 9;
      step.requests.push_back(d);
    }
    return step;
  };
  auto decode_step = [&](const std::vector<int32_t>& drafts, const HostLogits& logits) {
    Step step = MakeStep(StepKind::kDecode, logits, vocab);
    RequestInputs r = DecodeRequest("p0", 0, static_cast<int32_t>(drafts.size()) + 1, 0, 10);
    r.params = params;
    r.params.seq_seed = 40;
    r.draft_token_ids = drafts;
    r.drafts.form = DraftDistributions::Form::kPool;
    step.requests.push_back(r);
    return step;
  };

  HostLogits draft_logits(4, vocab, 11, 2.0f);
  const StepResult first = RunStep(gpu, draft_step({2, 2}, draft_logits));
  ASSERT_TRUE(first.results[0].status.ok()) << first.results[0].status;
  EXPECT_EQ(first.results[1].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(first.results[1].status.message().find("requests[1]: draft pool full"), std::string::npos)
      << first.results[1].status;
  EXPECT_EQ(gpu.draft_pool().UsedBytes(), 2 * row_bytes + entry_bytes);

  // The same DRAFT (p0 alone) and DECODE on the CPU: the same tokens.
  const StepResult cpu_first = RunStep(*cpu, draft_step({2}, draft_logits));
  EXPECT_EQ(cpu_first.results[0].token_ids, first.results[0].token_ids);
  HostLogits target(3, vocab, 12, 2.0f);
  const StepResult gpu_decode = RunStep(gpu, decode_step(first.results[0].token_ids, target));
  const StepResult cpu_decode = RunStep(*cpu, decode_step(cpu_first.results[0].token_ids, target));
  ASSERT_TRUE(gpu_decode.results[0].status.ok()) << gpu_decode.results[0].status;
  EXPECT_EQ(gpu_decode.results[0].token_ids, cpu_decode.results[0].token_ids);
  EXPECT_EQ(gpu_decode.results[0].num_accepted, cpu_decode.results[0].num_accepted);
  EXPECT_EQ(gpu.draft_pool().UsedBytes(), 0);

  for (int cycle = 0; cycle < 50; ++cycle) {
    HostLogits logits(3, vocab, 100 + cycle, 2.0f);
    const StepResult d = RunStep(gpu, draft_step({3}, logits));
    ASSERT_TRUE(d.results[0].status.ok()) << "cycle " << cycle << ": " << d.results[0].status;
    if (cycle % 2 == 0) {
      HostLogits t(4, vocab, 200 + cycle, 2.0f);
      const StepResult v = RunStep(gpu, decode_step(d.results[0].token_ids, t));
      ASSERT_TRUE(v.results[0].status.ok()) << "cycle " << cycle << ": " << v.results[0].status;
    } else {
      EXPECT_EQ(gpu.draft_pool().Release(DraftPoolKey("", "p0")), 3);
    }
    ASSERT_EQ(gpu.draft_pool().UsedBytes(), 0);
  }
}

// CPU against CUDA on every kernel path, the same rows each time: V = 1000 and 129,280 (split
// for top_k <= 64, fused for the rest, general with force top-N) and 400,000 (too wide for the
// fused path: general), each top_k of `top_ks`, force top-N off and 64. `shape(logits, vocab)`
// sets a V's rows; `requests(step, vocab, top_k)` adds the step's requests;
// `check_cpu(on_cpu, force, what)` checks the CPU's answers before the GPU's are compared with
// them (counted in `tally`).
template <typename Shape, typename Requests, typename CheckCpu>
void CompareOnEveryPath(int rows, uint64_t seed, std::initializer_list<int32_t> top_ks, Shape shape,
                        Requests requests, CheckCpu check_cpu, CompareTally& tally) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  for (int32_t vocab : {1000, 129280, 400000}) {
    HostLogits logits(rows, vocab, seed, 2.0f);
    shape(logits, vocab);
    for (int32_t top_k : top_ks) {
      for (int32_t force : {0, 64}) {
        Step step = MakeStep(StepKind::kPrefill, logits, vocab);
        step.force_top_n = force;
        requests(step, vocab, top_k);
        const std::string what = "V=" + std::to_string(vocab) + " top_k=" +
                                 std::to_string(top_k) + " force=" + std::to_string(force);
        const StepResult on_cpu = RunStep(*cpu, step);
        check_cpu(on_cpu, force, what);
        if (::testing::Test::HasFatalFailure()) return;
        CompareWithCpu(on_cpu, RunStep(*gpu, step), tally, what, step);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// SPEC 3: a finite value that a penalty or the temperature pushes out of float32 fails its
// request, on every kernel path, with the CPU backend's status and message; the same huge
// values masked out, or at T >= 1, are sampled normally.
TEST(CudaBackend, ValuesLeavingFloat32FailTheirRequestOnEveryPath) {
  CompareTally tally;
  CompareOnEveryPath(
      7, 17, {-1, 20},
      [](HostLogits& logits, int32_t vocab) {
        logits.Row(0)[5] = 10.0f;          // / repetition 1e-38 -> +inf
        logits.Row(1)[vocab - 1] = 1e34f;  // / 1e-5 (temperature 0) -> +inf
        logits.Row(2)[vocab / 2] = 3e38f;  // / 0.5 -> +inf
        logits.Row(3)[7] = -3e38f;         // / 0.5 -> -inf
        logits.Row(4)[7] = 3e38f;          // masked out: harmless
        logits.Row(5)[9] = 3e38f;          // temperature 1: harmless
        logits.Row(6)[3] = -10.0f;         // * repetition 1e38 -> -inf
      },
      [](Step& step, int32_t vocab, int32_t top_k) {
        for (int r = 0; r < 7; ++r) {
          RequestInputs req = PrefillRequest("r" + std::to_string(r), r, 70 + r, 9);
          req.params.temperature = 0.5f;
          req.params.top_k = top_k;
          req.params.top_logprobs = 3;
          step.requests.push_back(req);
        }
        step.requests[0].params.repetition_penalty = 1e-38f;
        step.requests[0].prompt_token_ids = {5};
        step.requests[1].params.temperature = 0.0f;
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocab; ++t) {
          if (t != 7) allowed.push_back(t);
        }
        step.requests[4].allowed_token_masks = {MaskOf(vocab, allowed)};
        step.requests[5].params.temperature = 1.0f;
        // Known divergence on the fused path (top_k off), asserted as it stands by
        // KnownFailureHugeLogitTopLogprobsOnTheFusedPath; the split path is compared.
        if (top_k <= 0) step.requests[5].params.top_logprobs = 0;
        step.requests[6].params.repetition_penalty = 1e38f;
        step.requests[6].output_token_ids = {3};
      },
      [](const StepResult& on_cpu, int32_t force, const std::string& what) {
        // Force top-N removes row 3's -3e38 (step 4) before the temperature (step 5) sees it.
        for (int r : {0, 1, 2, 3, 6}) {
          if (r == 3 && force > 0) {
            EXPECT_TRUE(on_cpu.results[r].status.ok()) << what << ": " << on_cpu.results[r].status;
            continue;
          }
          EXPECT_NE(on_cpu.results[r].status.message().find("out of the float32 range"),
                    std::string::npos)
              << what << " request " << r << ": " << on_cpu.results[r].status;
        }
        EXPECT_TRUE(on_cpu.results[4].status.ok()) << what << ": " << on_cpu.results[4].status;
        EXPECT_TRUE(on_cpu.results[5].status.ok()) << what << ": " << on_cpu.results[5].status;
      },
      tally);
  EXPECT_EQ(tally.token_mismatches, 0);
}

// A known failure, tied to issue 34 (kernels round two), asserted as it stands so that the fix
// flips this test (then compare request 5 of the test above on every path). With a logit of
// 3e38 at T = 1 every other token's probability underflows to 0 while its logprob (about -3e38)
// stays finite, and SPEC 7 lists those tokens, as the CPU does; the fused path (no top-k) pads
// the top logprobs past the maximum with (-1, -inf) instead. The sampled token and its logprob
// agree.
TEST(CudaBackend, KnownFailureHugeLogitTopLogprobsOnTheFusedPath) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  constexpr int32_t kVocab = 129280;
  HostLogits logits(1, kVocab, 5, 1.0f);
  logits.Row(0)[9] = 3e38f;
  Step step = MakeStep(StepKind::kPrefill, logits, kVocab);
  RequestInputs r = PrefillRequest("huge", 0, 75, 9);
  r.params.temperature = 1.0f;
  r.params.top_logprobs = 3;
  step.requests = {r};
  const RequestResult on_cpu = RunStep(*cpu, step).results[0];
  const RequestResult on_gpu = RunStep(*gpu, step).results[0];
  ASSERT_TRUE(on_cpu.status.ok()) << on_cpu.status;
  ASSERT_TRUE(on_gpu.status.ok()) << on_gpu.status;
  EXPECT_EQ(on_cpu.token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(on_gpu.token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(on_gpu.logprobs, on_cpu.logprobs);
  const TopLogprobs& want = on_cpu.top_logprobs[0];
  const TopLogprobs& got = on_gpu.top_logprobs[0];
  EXPECT_EQ(want.token_ids[0], 9);
  EXPECT_EQ(got.token_ids[0], 9);
  // The CPU (SPEC 7) lists two more tokens at finite logprobs near -3e38 ...
  EXPECT_NE(want.token_ids[1], -1);
  EXPECT_TRUE(std::isfinite(want.logprobs[1]) && want.logprobs[1] < -1e38f) << want.logprobs[1];
  // ... the fused path pads: the known failure (issue 34).
  EXPECT_EQ(got.token_ids[1], -1) << "fixed? then drop this test's known-failure half";
  EXPECT_EQ(got.logprobs[1], -std::numeric_limits<float>::infinity());
}

// -0.0 and +0.0 are equal scores (they tie and rank by id: OrderKey gives them one key), and a
// temperature of +inf makes every finite score +-0 (a uniform distribution, ranked by id);
// a huge finite T makes scores subnormal, where distant x can share a score. On every path.
TEST(CudaBackend, SignedZerosAndHugeTemperaturesMatchCpu) {
  const int rows = 4;
  CompareTally tally;
  CompareOnEveryPath(
      rows, 23, {-1, 20, 300},
      [](HostLogits& logits, int32_t vocab) {
        // Row 0: the row's largest values are signed zeros at scattered ids.
        for (int32_t t = 0; t < vocab; ++t) logits.Row(0)[t] = -std::fabs(logits.Row(0)[t]) - 0.5f;
        for (int32_t t = 3; t < vocab; t += vocab / 40 + 1) logits.Row(0)[t] = (t / 3) % 2 ? 0.0f : -0.0f;
        // Rows 1-3: some -inf logits too (x * (log2(e) / T) is NaN for x = -inf when T = +inf).
        for (int r = 1; r < rows; ++r) {
          for (int32_t t = r; t < vocab; t += 97) logits.Row(r)[t] = -std::numeric_limits<float>::infinity();
        }
      },
      [](Step& step, int32_t, int32_t top_k) {
        for (int r = 0; r < rows; ++r) {
          RequestInputs req = PrefillRequest("r" + std::to_string(r), r, 90 + r, 9);
          req.params.top_k = top_k;
          req.params.top_p = 0.9f;
          req.params.top_logprobs = 4;
          step.requests.push_back(req);
        }
        step.requests[0].params.temperature = 1.0f;
        step.requests[1].params.temperature = std::numeric_limits<float>::infinity();
        step.requests[2].params.temperature = 1e38f;  // x / T subnormal for |x| < ~1.2
        step.requests[3].params.temperature = 3e37f;
      },
      [](const StepResult& on_cpu, int32_t, const std::string& what) {
        for (int r = 0; r < rows; ++r) {
          ASSERT_TRUE(on_cpu.results[r].status.ok()) << what << " request " << r << ": "
                                                      << on_cpu.results[r].status;
        }
      },
      tally);
  EXPECT_EQ(tally.token_mismatches, 0);
}

TEST(CudaBackend, BitwiseRepeatableAndBatchInvariant) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  const int32_t vocab = 129280;
  HostLogits logits(16, vocab, 5, 2.0f);
  std::vector<std::string> masks;
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_p = 0.95f;
  params.top_k = 50;
  params.top_logprobs = 5;
  const Step step = PrefillStep(logits, vocab, 16, 3, params, 0, false, &masks);
  const StepResult a = RunStep(*gpu, step);
  const StepResult b = RunStep(*gpu, step);
  for (size_t i = 0; i < a.results.size(); ++i) {
    EXPECT_EQ(a.results[i].token_ids, b.results[i].token_ids);
    EXPECT_EQ(0, std::memcmp(a.results[i].logprobs.data(), b.results[i].logprobs.data(),
                             a.results[i].logprobs.size() * 4));
    EXPECT_EQ(0, std::memcmp(a.results[i].sum_smaller_probs.data(),
                             b.results[i].sum_smaller_probs.data(),
                             a.results[i].sum_smaller_probs.size() * 4));
    Step alone = step;
    alone.requests = {step.requests[i]};
    const StepResult single = RunStep(*gpu, alone);
    EXPECT_EQ(single.results[0].token_ids, a.results[i].token_ids);
    EXPECT_EQ(0, std::memcmp(single.results[0].logprobs.data(), a.results[i].logprobs.data(),
                             a.results[i].logprobs.size() * 4));
    ASSERT_EQ(single.results[0].top_logprobs.size(), 1u);
    EXPECT_EQ(single.results[0].top_logprobs[0].token_ids, a.results[i].top_logprobs[0].token_ids);
  }
}

// Steps on all lanes at once (more threads than lanes, so some wait for one) give bitwise the
// results each step gives alone: the lanes share nothing a step's answer depends on. Eight
// different steps (sizes, masks, top-k on both paths, penalties), each run once alone, then
// all of them from 8 threads at once, 4 rounds.
TEST(CudaBackend, ConcurrentStepsOnAllLanesGiveTheSameResultsAsAlone) {
  auto created = Gpu(4);
  ASSERT_NE(created, nullptr);
  CudaBackend& gpu = *created;
  EXPECT_EQ(gpu.max_concurrent_steps(), 4);
  constexpr int kSteps = 8;
  std::vector<HostLogits> logits;
  std::vector<std::vector<std::string>> masks(kSteps);
  std::vector<Step> steps;
  logits.reserve(kSteps);
  for (int k = 0; k < kSteps; ++k) {
    const int32_t vocab = k % 2 == 0 ? 129280 : 32000 + 17 * k;
    const int rows = 1 + 5 * k;
    logits.emplace_back(rows, vocab, 100 + k, 2.0f);
    SamplingParams params;
    params.temperature = 0.7f + 0.05f * k;
    params.top_p = 0.95f;
    params.top_k = k % 3 == 0 ? -1 : 50;  // off: the fused path; 50: the split path
    params.top_logprobs = 5;
    params.repetition_penalty = k % 4 == 1 ? 1.2f : 1.0f;
    steps.push_back(PrefillStep(logits.back(), vocab, rows, 7 + k, params, 0, k % 2 == 1, &masks[k]));
  }
  std::vector<StepResult> alone;
  for (const Step& step : steps) alone.push_back(RunStep(gpu, step));
  auto same = BitwiseSame;
  for (int round = 0; round < 4; ++round) {
    std::vector<StepResult> together(kSteps);
    std::vector<std::thread> threads;
    for (int k = 0; k < kSteps; ++k) {
      threads.emplace_back([&, k] { together[k] = RunStep(gpu, steps[k]); });
    }
    for (std::thread& t : threads) t.join();
    for (int k = 0; k < kSteps; ++k) {
      EXPECT_TRUE(same(alone[k], together[k])) << "round " << round << " step " << k;
      EXPECT_GT(together[k].kernel_us, 0.0f) << "round " << round << " step " << k;
      for (const RequestResult& r : together[k].results) {
        EXPECT_TRUE(r.status.ok()) << "step " << k << ": " << r.status;
      }
    }
  }
}

// SPEC 6: NaN or +inf anywhere in a sent or pooled draft row fails its request on the GPU
// exactly as on the CPU (same code, same message), read by verification or not.
TEST(CudaBackend, DraftRowsWithNaNOrPosInfFailTheirRequestAsOnTheCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  CompareTally tally;
  for (DraftRuleCase& c : DraftRuleCases()) {
    SCOPED_TRACE(c.what);
    auto cpu = Cpu();
    if (c.prepare_pool) {
      c.prepare_pool(cpu->draft_pool());
      c.prepare_pool(gpu->draft_pool());
    }
    const StepResult on_cpu = RunStep(*cpu, c.step);
    const StepResult on_gpu = RunStep(*gpu, c.step);
    CompareWithCpu(on_cpu, on_gpu, tally, c.what, c.step);
    EXPECT_EQ(on_gpu.results[0].status.code(), c.code) << on_gpu.results[0].status;
    EXPECT_TRUE(on_gpu.results[1].status.ok()) << on_gpu.results[1].status;
  }
  EXPECT_EQ(tally.token_mismatches, 0);
}

// Issue 25's step: DECODE, V 250 in 251 columns, force_top_n 42, 8 rows; one request with
// top_logprobs -1 and one with a draft id of 250 (each fails alone) beside the valid one.
struct IssueStep {
  IssueStep() : logits(8, 251, 2525, 3.0f) {
    step = MakeStep(StepKind::kDecode, logits, 250);
    step.force_top_n = 42;
    RequestInputs bad_top;
    bad_top.request_id = "bad-top";
    bad_top.first_row = 0;
    bad_top.num_rows = 2;
    bad_top.params.top_logprobs = -1;
    bad_top.params.seq_seed = 1;
    bad_top.draft_token_ids = {5};
    bad_top.drafts.form = DraftDistributions::Form::kTopN;
    draft_values = HostLogits(1, 1);
    draft_values.values[0] = -0.5f;
    bad_top.drafts.values = draft_values.View();
    bad_top.drafts.token_ids = {5};
    RequestInputs bad_draft = bad_top;
    bad_draft.request_id = "bad-draft";
    bad_draft.first_row = 2;
    bad_draft.params.top_logprobs = 2;
    bad_draft.draft_token_ids = {250};
    RequestInputs valid;
    valid.request_id = "valid";
    valid.first_row = 5;
    valid.num_rows = 1;
    valid.params.temperature = 0.318f;
    valid.params.top_p = 0.855f;
    valid.params.min_p = 0.214f;
    valid.params.seq_seed = 3;
    step.requests = {bad_top, bad_draft, valid};
  }
  HostLogits logits;
  HostLogits draft_values{1, 1};
  Step step;
};

// The race behind issue 25's INTERNAL step: the fused kernel's shared-memory limit was set per
// launch, so a V = 2 step's smaller limit could land between a V = 250 step's set and its
// launch on another lane (cudaErrorInvalidValue). Both shapes from 8 threads on 4 lanes; every
// answer is the CPU's.
TEST(CudaBackend, IssueStepBesideTinyVocabularyStepsOnEveryLaneNeverFails) {
  auto created = Gpu(4);
  ASSERT_NE(created, nullptr);
  CudaBackend& gpu = *created;
  const IssueStep issue;
  const HostLogits tiny_logits(4, 2, 77, 1.0f);
  Step tiny = MakeStep(StepKind::kPrefill, tiny_logits, 2);
  for (int r = 0; r < 4; ++r) tiny.requests.push_back(PrefillRequest("t" + std::to_string(r), r, 40 + r));
  auto cpu = Cpu();
  const StepResult want_issue = RunStep(*cpu, issue.step);
  const StepResult want_tiny = RunStep(*cpu, tiny);
  ASSERT_EQ(want_issue.results[0].status.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(want_issue.results[1].status.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(want_issue.results[2].status.ok());
  constexpr int kThreads = 8, kSteps = 200;
  std::atomic<int> failed_steps{0};
  std::vector<std::thread> threads;
  std::mutex mu;
  CompareTally tally;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kSteps; ++k) {
        const bool wide = (t + k) % 2 == 0;
        const Step& step = wide ? issue.step : tiny;
        auto plan = PlanStep(step, Limits{}, [] { return uint64_t{9}; });
        auto result = gpu.Sample(*plan);
        if (!result.ok()) {
          ++failed_steps;
          std::lock_guard<std::mutex> lock(mu);
          ADD_FAILURE() << "thread " << t << " step " << k << ": " << result.status();
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        CompareWithCpu(wide ? want_issue : want_tiny, *result, tally, wide ? "issue" : "tiny", step);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failed_steps.load(), 0);
  EXPECT_EQ(tally.token_mismatches, 0);
  std::printf("issue step beside V = 2: %d steps on 4 lanes, %d failed\n", kThreads * kSteps,
              failed_steps.load());
}

// A CUDA error that is no request's fault (a real cudaErrorInvalidValue where the launches
// are, after the step's inputs were queued) fails only the step that hit it, with its launch
// configuration in the message; the lane then serves the next steps, whose answers are the CPU's.
TEST(CudaBackend, AFailedLaunchFailsOnlyItsStepAndItsLaneServesTheNext) {
  auto created = Gpu(1);  // one lane: the failed step's lane is the one the next steps use
  ASSERT_NE(created, nullptr);
  CudaBackend& gpu = *created;
  const IssueStep issue;
  auto cpu = Cpu();
  const StepResult want = RunStep(*cpu, issue.step);
  auto plan = PlanStep(issue.step, Limits{}, [] { return uint64_t{9}; });
  ASSERT_TRUE(plan.ok());
  FailNextLaunches(gpu, 1);
  auto failed = gpu.Sample(*plan);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  const std::string message(failed.status().message());
  EXPECT_THAT(message, ::testing::HasSubstr("cudaErrorInvalidValue"));
  EXPECT_THAT(message, ::testing::HasSubstr("launch on lane 0: SplitRowKernel grid 1x0x1 block 256x1x1"));
  EXPECT_THAT(message, ::testing::HasSubstr("ClusterSampleKernel grid 8x1x1 block"));
  EXPECT_THAT(message, ::testing::HasSubstr("step DECODE vocab_size 250 logits [8, 251] row_stride 251"));
  std::printf("failed launch: %s\n", message.c_str());
  CompareTally tally;
  for (int k = 0; k < 5; ++k) {
    auto again = gpu.Sample(*plan);
    ASSERT_TRUE(again.ok()) << again.status();
    CompareWithCpu(want, *again, tally, "after the failed launch", issue.step);
  }
  EXPECT_EQ(tally.token_mismatches, 0);
}

// The replacement after a rejection is drawn from the residual max(0, p - q) in the order
// residual descending, ties by id (SPEC 5). Tokens 0-9 tie in p; q gives 3, 5 and 7 residuals
// below p by 1e-12, 1e-20 and 1e-9: in float64 5 still ties (1e-20 is under p's ulp), 3 and 7
// fall behind, where a float image of the residual tied all ten and drew by id: the stress
// test found the kernels answering so (both the fused path's finish and, with force top-N, the
// general algorithm). 64 seeds a configuration; every token must be the CPU's.
TEST(CudaBackend, ResidualDrawOrdersNearTiesAsTheCpu) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  constexpr int32_t kVocab = 64;
  constexpr int kRequests = 64;
  HostLogits logits(2 * kRequests, kVocab);
  HostLogits q(kRequests, kVocab);
  for (int r = 0; r < kRequests; ++r) {
    for (int32_t t = 0; t < kVocab; ++t) {
      logits.Row(2 * r)[t] = t < 10 ? 1.0f : -6.0f - 0.01f * t;
      logits.Row(2 * r + 1)[t] = 0.5f * static_cast<float>(t % 7);
      q.Row(r)[t] = -std::numeric_limits<float>::infinity();
    }
    q.Row(r)[40] = std::log(0.5f);  // the draft: p(40) is tiny, so it is rejected
    q.Row(r)[3] = std::log(1e-12f);
    q.Row(r)[5] = std::log(1e-20f);
    q.Row(r)[7] = std::log(1e-9f);
  }
  CompareTally tally;
  for (int32_t force : {0, 32}) {
    Step step = MakeStep(StepKind::kDecode, logits, kVocab);
    step.force_top_n = force;
    for (int r = 0; r < kRequests; ++r) {
      RequestInputs req = DecodeRequest("r" + std::to_string(r), 2 * r, 2, 7000 + r, 1000 + r);
      req.draft_token_ids = {40};
      req.drafts.form = DraftDistributions::Form::kDense;
      req.drafts.values = q.RowsView(r, 1);
      step.requests.push_back(req);
    }
    const StepResult on_cpu = RunStep(*cpu, step);
    const StepResult on_gpu = RunStep(*gpu, step);
    CompareWithCpu(on_cpu, on_gpu, tally, "force_top_n " + std::to_string(force), step);
    int replaced_behind = 0;  // replacements that only the float64 order draws right
    for (const RequestResult& r : on_cpu.results) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.num_accepted, 0);
      replaced_behind += r.token_ids[0] >= 3 && r.token_ids[0] <= 9;
    }
    EXPECT_GT(replaced_behind, 10) << "the seeds must reach the reordered intervals";
  }
  EXPECT_EQ(tally.token_mismatches, 0);
}

// StepOutput (issue 46): the assembled tokens land in device memory, -1 past each request's
// tokens and for a failed request, then the accept counts and the done word; a step that fails
// as a whole writes nothing.
TEST(CudaBackend, StepOutputWritesTheTokensIntoDeviceMemory) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  const int32_t vocab = 1000, stride = 4;
  HostLogits logits(9, vocab, 7, 2.0f);
  Step step = MakeStep(StepKind::kDraft, logits, vocab);
  for (int i = 0; i < 3; ++i) {
    RequestInputs r;
    r.request_id = "d" + std::to_string(i);
    r.rows = {3 * i, 3 * i + 1, 3 * i + 2};
    r.draft_indices = {1, 2, 3};
    r.params.seq_seed = 40 + i;
    if (i == 1) r.params.top_p = 2.0f;  // fails alone
    step.requests.push_back(r);
  }
  const size_t words = 3 * stride + 3 + 1;
  int32_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), words * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(device, 0x7f, words * sizeof(int32_t)), cudaSuccess);
  step.output.token_ids = device;
  step.output.tokens_per_request = stride;
  step.output.num_accepted = device + 3 * stride;
  step.output.done_word = device + 3 * stride + 3;
  step.output.done_value = 17;
  const StepResult result = RunStep(*gpu, step);
  std::vector<int32_t> got(words);
  ASSERT_EQ(cudaMemcpy(got.data(), device, words * sizeof(int32_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> want(stride, -1);
    if (result.results[i].status.ok()) {
      ASSERT_EQ(result.results[i].token_ids.size(), 3u);
      std::copy(result.results[i].token_ids.begin(), result.results[i].token_ids.end(),
                want.begin());
    }
    EXPECT_EQ(std::vector<int32_t>(got.begin() + stride * i, got.begin() + stride * (i + 1)),
              want)
        << i;
    EXPECT_EQ(got[3 * stride + i], 0) << "DRAFT steps accept nothing";
  }
  EXPECT_FALSE(result.results[1].status.ok());
  EXPECT_EQ(got[3 * stride + 3], 17);

  // A step that fails as a whole (a failed launch) leaves the area as it was.
  ASSERT_EQ(cudaMemset(device, 0, words * sizeof(int32_t)), cudaSuccess);
  step.output.done_value = 18;
  FailNextLaunches(*gpu, 1);
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{9}; });
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(gpu->Sample(*plan).ok());
  ASSERT_EQ(cudaMemcpy(got.data(), device, words * sizeof(int32_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, std::vector<int32_t>(words, 0));
  cudaFree(device);
}

// The device writes the StepOutput of DECODE and PREFILL steps itself (PlanDeviceOutput):
// what it writes must be what the host assembles. DECODE: an accepted prefix, a rejection at
// the first draft, a request failed in planning, one failed by a NaN in its second row;
// PREFILL: a request failed by a NaN in a prompt row beside one that samples.
TEST(CudaBackend, StepOutputFromTheDeviceIsTheAssembledResult) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  const int32_t vocab = 3000, stride = 5, q = 3;
  struct Area {
    explicit Area(size_t words) : words(words) {
      EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), words * sizeof(int32_t)), cudaSuccess);
      EXPECT_EQ(cudaMemset(data, 0x7f, words * sizeof(int32_t)), cudaSuccess);
    }
    ~Area() { cudaFree(data); }
    std::vector<int32_t> Read() const {
      std::vector<int32_t> got(words);
      EXPECT_EQ(cudaMemcpy(got.data(), data, words * sizeof(int32_t), cudaMemcpyDeviceToHost),
                cudaSuccess);
      return got;
    }
    size_t words;
    int32_t* data = nullptr;
  };
  // `s`'s StepOutput in `a`: n requests' tokens, then their accept counts, then the done word.
  auto aim = [&](Step& s, const Area& a, int n, uint32_t done) {
    s.output.token_ids = a.data;
    s.output.tokens_per_request = stride;
    s.output.num_accepted = a.data + n * stride;
    s.output.done_word = a.data + n * (stride + 1);
    s.output.done_value = done;
  };
  auto expect_area = [&](const StepResult& result, const std::vector<int32_t>& got, size_t n,
                         uint32_t done) {
    for (size_t i = 0; i < n; ++i) {
      std::vector<int32_t> want(stride, -1);
      int32_t accepted = 0;
      if (result.results[i].status.ok()) {
        std::copy(result.results[i].token_ids.begin(), result.results[i].token_ids.end(),
                  want.begin());
        accepted = result.results[i].num_accepted;
      }
      EXPECT_EQ(std::vector<int32_t>(got.begin() + stride * i, got.begin() + stride * (i + 1)),
                want)
          << "request " << i;
      EXPECT_EQ(got[n * stride + i], accepted) << "request " << i;
    }
    EXPECT_EQ(static_cast<uint32_t>(got[n * (stride + 1)]), done);
  };

  const int requests = 5;
  HostLogits target(requests * q, vocab, 11, 2.0f);
  HostLogits drafts(requests * (q - 1), vocab);
  std::vector<std::vector<int32_t>> draft_ids(requests);
  for (int i = 0; i < requests; ++i) {
    for (int j = 0; j < q - 1; ++j) {
      // Requests 0, 2 and 4 draft from the target's own distribution (accepted but for
      // request 4's second draft); request 3 drafts a token the target all but excludes.
      const float* p = target.Row(i * q + j);
      float* row = drafts.Row(i * (q - 1) + j);
      const bool rejected = i == 3 || (i == 4 && j == 1);
      const float m = *std::max_element(p, p + vocab);
      double z = 0.0;
      for (int32_t t = 0; t < vocab; ++t) z += std::exp(static_cast<double>(p[t] - m));
      int32_t best = 0;
      for (int32_t t = 0; t < vocab; ++t) {
        row[t] = p[t] - m - static_cast<float>(std::log(z));
        if (p[t] > p[best]) best = t;
      }
      int32_t draft = best;
      if (rejected) {
        draft = static_cast<int32_t>(std::min_element(p, p + vocab) - p);
        for (int32_t t = 0; t < vocab; ++t) row[t] = t == draft ? 0.0f : -INFINITY;
      }
      draft_ids[i].push_back(draft);
    }
  }
  target.Row(2 * q + 1)[17] = NAN;
  Step step = MakeStep(StepKind::kDecode, target, vocab);
  for (int i = 0; i < requests; ++i) {
    RequestInputs r = DecodeRequest("r" + std::to_string(i), i * q, q, 300 + i, 90 + i);
    if (i == 1) r.params.top_p = 2.0f;  // fails in planning
    r.draft_token_ids = draft_ids[i];
    r.drafts.form = DraftDistributions::Form::kDense;
    r.drafts.values = drafts.RowsView(i * (q - 1), q - 1);
    step.requests.push_back(r);
  }
  Area decode(requests * (stride + 1) + 1);
  aim(step, decode, requests, 5);
  const StepResult result = RunStep(*gpu, step);
  ASSERT_TRUE(result.results[0].status.ok()) << result.results[0].status;
  EXPECT_EQ(result.results[0].num_accepted, 2);
  EXPECT_FALSE(result.results[1].status.ok());
  EXPECT_FALSE(result.results[2].status.ok());
  ASSERT_TRUE(result.results[3].status.ok()) << result.results[3].status;
  EXPECT_EQ(result.results[3].num_accepted, 0);
  ASSERT_TRUE(result.results[4].status.ok()) << result.results[4].status;
  EXPECT_EQ(result.results[4].num_accepted, 1);
  expect_area(result, decode.Read(), requests, 5);

  HostLogits prefill_logits(8, vocab, 12, 2.0f);
  prefill_logits.Row(2)[40] = NAN;
  Step prefill = MakeStep(StepKind::kPrefill, prefill_logits, vocab);
  for (int i = 0; i < 2; ++i) {
    RequestInputs r;
    r.request_id = "p" + std::to_string(i);
    r.row = 4 * i + 3;
    r.params.seq_seed = 400 + i;
    r.prompt_first_row = 4 * i;
    r.prompt_targets = {5, 6, 7};
    prefill.requests.push_back(r);
  }
  Area area(2 * (stride + 1) + 1);
  aim(prefill, area, 2, 6);
  const StepResult prefilled = RunStep(*gpu, prefill);
  EXPECT_FALSE(prefilled.results[0].status.ok());
  ASSERT_TRUE(prefilled.results[1].status.ok()) << prefilled.results[1].status;
  expect_area(prefilled, area.Read(), 2, 6);

  // The host's write of the same steps (device_step_output off) lands the same words.
  CudaBackendOptions host_options;
  host_options.device_step_output = false;
  auto host_writer = CudaBackend::Create(host_options);
  ASSERT_TRUE(host_writer.ok()) << host_writer.status();
  Area decode_host(decode.words), area_host(area.words);
  aim(step, decode_host, requests, 5);
  EXPECT_TRUE(BitwiseSame(RunStep(**host_writer, step), result));
  EXPECT_EQ(decode_host.Read(), decode.Read());
  aim(prefill, area_host, 2, 6);
  EXPECT_TRUE(BitwiseSame(RunStep(**host_writer, prefill), prefilled));
  EXPECT_EQ(area_host.Read(), area.Read());
}

// A copy of host bytes in device memory, freed with the test.
struct DeviceBytes {
  DeviceBytes(const void* host, size_t bytes) {
    EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(data); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* data = nullptr;
};

// The device's StepOutput write on its own launch, rule by rule, including a case the
// backend's DECODE and PREFILL steps do not produce today (a request that failed before the
// launch yet has jobs: its flag, not its rows' results, must decide).
TEST(CudaBackend, StepOutputKernelAppliesTheAssemblyRules) {
  std::vector<cuda::RowResult> results(6);
  for (size_t k = 0; k < results.size(); ++k) {
    std::memset(&results[k], 0, sizeof(cuda::RowResult));
    results[k].token = 11 + static_cast<int32_t>(k);
    results[k].accepted = 1;
  }
  results[1].accepted = 0;  // request 0's second row rejects its draft
  results[3].status = 1;    // request 2's row failed on the device
  results[5].status = 1;    // request 4's prompt row failed
  std::vector<cuda::OutputRequest> requests(5);
  requests[0] = {0, 3, 0, 0, 0};  // rows 0-2: 11 accepted, 12 replaces the second draft
  requests[1] = {2, 1, 0, 0, 1};  // failed before the launch, with a row
  requests[2] = {3, 1, 0, 0, 0};  // its row failed
  requests[3] = {4, 1, 0, 0, 0};  // one row: 15
  requests[4] = {2, 1, 5, 1, 0};  // its prompt row failed
  const int per = 3, n = static_cast<int>(requests.size());
  DeviceBytes results_d(results.data(), results.size() * sizeof(cuda::RowResult));
  DeviceBytes requests_d(requests.data(), requests.size() * sizeof(cuda::OutputRequest));
  std::vector<int32_t> area(n * (per + 1) + 1, 0x7f7f7f7f);
  DeviceBytes area_d(area.data(), area.size() * sizeof(int32_t));
  cuda::OutputParams params;
  params.results = static_cast<const cuda::RowResult*>(results_d.data);
  params.requests = static_cast<const cuda::OutputRequest*>(requests_d.data);
  params.num_requests = n;
  params.decode = 1;
  params.token_ids = static_cast<int32_t*>(area_d.data);
  params.tokens_per_request = per;
  params.num_accepted = params.token_ids + n * per;
  params.done_word = reinterpret_cast<unsigned int*>(params.num_accepted + n);
  params.done_value = 9;
  ASSERT_EQ(cuda::LaunchWriteStepOutput(params, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(area.data(), area_d.data, area.size() * sizeof(int32_t),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  const std::vector<int32_t> tokens(area.begin(), area.begin() + n * per);
  EXPECT_EQ(tokens, (std::vector<int32_t>{11, 12, -1, -1, -1, -1, -1, -1, -1, 15, -1, -1,
                                          -1, -1, -1}));
  const std::vector<int32_t> accepted(area.begin() + n * per, area.begin() + n * (per + 1));
  EXPECT_EQ(accepted, (std::vector<int32_t>{1, 0, 0, 0, 0}));
  EXPECT_EQ(area.back(), 9);
}


// Issue 47: a worker's draft tensors in device memory (dense rows in float32 and bfloat16 with
// a row stride, top-N rows) are read in place and answer bitwise as the same tensors sent from
// the host, over the split and general paths, with rejections; SPEC 6's NaN / +inf rule holds
// on device rows: the request fails with the CPU backend's message for the same bytes, and
// the other requests of the step answer as before.
TEST(CudaBackend, DeviceDraftsAnswerAsHostDrafts) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  auto cpu = Cpu();
  const int32_t vocab = 5000, stride = vocab + 40, q = 4, requests = 6, n = 8;
  HostLogits target(requests * q, vocab, 3, 2.0f);
  // Each request's q - 1 draft rows: a draft model's processed logprobs (log-softmax of the
  // target row's logits plus noise, so that drafts are often accepted; for request 5 of
  // unrelated logits, so rejected), the last third of the vocabulary -inf for odd requests;
  // drafts are the draft rows' most likely tokens.
  std::vector<std::vector<float>> dense(requests);
  std::vector<std::vector<float>> topn_values(requests);
  std::vector<std::vector<int32_t>> topn_ids(requests), draft_ids(requests);
  for (int i = 0; i < requests; ++i) {
    HostLogits draft(q - 1, vocab, 100 + i, i == 5 ? 3.0f : 0.2f);
    dense[i].assign(static_cast<size_t>(q - 1) * stride, 0.0f);
    for (int j = 0; j < q - 1; ++j) {
      float* row = draft.Row(j);
      if (i != 5) {
        for (int32_t t = 0; t < vocab; ++t) row[t] += target.Row(i * q + j)[t];
      }
      if (i % 2 == 1) std::fill(row + 2 * vocab / 3, row + vocab, -INFINITY);
      const float m = *std::max_element(row, row + vocab);
      double z = 0.0;
      for (int32_t t = 0; t < vocab; ++t) z += std::exp(static_cast<double>(row[t] - m));
      std::vector<int32_t> ids(vocab);
      for (int32_t t = 0; t < vocab; ++t) {
        dense[i][j * stride + t] = row[t] - m - static_cast<float>(std::log(z));
        ids[t] = t;
      }
      const float* lp = dense[i].data() + j * stride;
      std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t x, int32_t y) {
        return lp[x] > lp[y] || (lp[x] == lp[y] && x < y);
      });
      draft_ids[i].push_back(ids[j % 3]);
      for (int k = 0; k < n; ++k) {
        topn_ids[i].push_back(k == n - 1 ? -1 : ids[k]);  // -1: no entry, as on the CPU
        topn_values[i].push_back(lp[ids[k]]);
      }
    }
  }
  std::vector<SamplingParams> params(3);
  params[0].temperature = 0.8f;
  params[0].top_k = 20;
  params[0].top_logprobs = 3;
  params[1].top_p = 0.9f;
  params[2].temperature = 1.3f;
  params[2].top_logprobs = 2;
  // form 0: dense float32, 1: dense bfloat16, 2: top-N float32.
  for (int form = 0; form < 3; ++form) {
    std::vector<std::vector<uint16_t>> bf16(requests);
    std::vector<std::unique_ptr<DeviceBytes>> held;
    Step host = MakeStep(StepKind::kDecode, target, vocab);
    host.compute_sum_smaller_probs = true;
    for (int i = 0; i < requests; ++i) {
      RequestInputs r = DecodeRequest("r" + std::to_string(i), i * q, q, 0, 30 + i);
      r.params = params[i % 3];
      r.params.seq_seed = 500 + i;
      r.draft_token_ids = draft_ids[i];
      LogitsView& v = r.drafts.values;
      v.rows = q - 1;
      if (form == 2) {
        r.drafts.form = DraftDistributions::Form::kTopN;
        r.drafts.token_ids = topn_ids[i];
        v.data = topn_values[i].data();
        v.cols = v.row_stride = n;
      } else {
        r.drafts.form = DraftDistributions::Form::kDense;
        v.cols = vocab;
        v.row_stride = stride;
        v.data = dense[i].data();
        if (form == 1) {
          for (float x : dense[i]) bf16[i].push_back(FloatToBFloat16(x));
          v.data = bf16[i].data();
          v.dtype = DType::kBFloat16;
        }
      }
      host.requests.push_back(r);
    }
    Step device = host;
    for (RequestInputs& r : device.requests) {
      LogitsView& v = r.drafts.values;
      held.push_back(std::make_unique<DeviceBytes>(v.data, v.ByteExtent()));
      v.data = held.back()->data;
      v.on_device = true;
    }
    const StepResult from_host = RunStep(*gpu, host);
    const StepResult from_device = RunStep(*gpu, device);
    int rejected = 0, accepted = 0;
    for (const RequestResult& r : from_host.results) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      rejected += r.num_accepted < q - 1;
      accepted += r.num_accepted;
    }
    EXPECT_TRUE(BitwiseSame(from_host, from_device)) << "form " << form;
    EXPECT_GT(rejected, 0) << "form " << form;
    EXPECT_GT(accepted, 0) << "form " << form;
    // The CPU backend reads no device memory: each such request fails on its own.
    const StepResult on_cpu = RunStep(*cpu, device);
    for (const RequestResult& r : on_cpu.results) {
      EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition) << r.status;
      EXPECT_THAT(std::string(r.status.message()), testing::HasSubstr("needs the CUDA backend"));
    }

    // A NaN and a +inf in request 2's row 1 (the +inf first): its request fails with the
    // CPU's message for the same host bytes, entries no verification reads included.
    const int64_t bad_nan = form == 2 ? 6 : 4321, bad_inf = form == 2 ? 5 : 4000;
    const int64_t row_elems = form == 2 ? n : stride;
    auto poke = [&](const LogitsView& v, int64_t at, float value) {
      const size_t elem = DTypeSize(v.dtype);
      uint16_t half = FloatToBFloat16(value);
      const void* src = v.dtype == DType::kBFloat16 ? static_cast<const void*>(&half)
                                                     : static_cast<const void*>(&value);
      std::memcpy(static_cast<char*>(const_cast<void*>(v.data)) + at * elem, src, elem);
    };
    // The host bytes of request 2's tensor, copied: the other forms' tensors stay finite.
    const LogitsView& clean = host.requests[2].drafts.values;
    std::vector<char> bad_bytes(static_cast<const char*>(clean.data),
                                static_cast<const char*>(clean.data) + clean.ByteExtent());
    Step bad_host = host;
    bad_host.requests[2].drafts.values.data = bad_bytes.data();
    Step bad_device = device;
    for (auto [at, value] : {std::pair<int64_t, float>{bad_nan, NAN}, {bad_inf, INFINITY}}) {
      poke(bad_host.requests[2].drafts.values, row_elems + at, value);
      const LogitsView& v = bad_device.requests[2].drafts.values;
      const size_t elem = DTypeSize(v.dtype);
      ASSERT_EQ(cudaMemcpy(static_cast<char*>(const_cast<void*>(v.data)) + (row_elems + at) * elem,
                           static_cast<const char*>(bad_host.requests[2].drafts.values.data) +
                               (row_elems + at) * elem,
                           elem, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    const StepResult cpu_bad = RunStep(*cpu, bad_host);
    const StepResult gpu_bad = RunStep(*gpu, bad_device);
    ASSERT_FALSE(cpu_bad.results[2].status.ok());
    EXPECT_EQ(gpu_bad.results[2].status, cpu_bad.results[2].status) << "form " << form;
    EXPECT_THAT(std::string(gpu_bad.results[2].status.message()),
                testing::HasSubstr(absl::StrCat("draft row 1 holds +inf at entry ", bad_inf)));
    for (int i = 0; i < requests; ++i) {
      if (i == 2) continue;
      StepResult a, b;
      a.results = {from_host.results[i]};
      b.results = {gpu_bad.results[i]};
      EXPECT_TRUE(BitwiseSame(a, b)) << "form " << form << " request " << i;
    }
  }
}

// Issue 47: tensor-parallel logits read in place from each rank's shard answer as the same
// logits sent as one device tensor, bitwise, on every path: split (small top-k), fused, the
// general kernel (V past the fused path, and the raw row of RAW logprobs). In fp32 and bf16;
// TP = 2 as a worker splits its lm_head, and uneven TP = 3 / 4 layouts whose boundaries break
// the 16-byte alignment (and the split path's 8,192-column chunks), with padded row strides
// and the tensor's padding columns in the last shard.
TEST(CudaBackend, DeviceShardsAnswerAsWholeLogits) {
  auto gpu = Gpu();
  ASSERT_NE(gpu, nullptr);
  std::vector<SamplingParams> sets = ParamSets();
  SamplingParams raw;
  raw.top_logprobs = 5;
  raw.logprobs_mode = 1;  // RAW
  raw.top_n_sigma = 1.5f;
  sets.push_back(raw);
  const int rows = 5;
  int compared = 0;
  for (int32_t vocab : {1000, 129280, 400000}) {
    const int32_t cols = vocab + 13;
    const HostLogits logits(rows, cols, static_cast<uint64_t>(vocab));
    const std::vector<std::vector<int32_t>> layouts = {
        {vocab / 2, cols - vocab / 2},
        {1, 7, cols - 8},
        {vocab / 4 + 5, vocab / 4 - 3, vocab / 4 + 1, cols - 3 * (vocab / 4) - 3}};
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const size_t elem = DTypeSize(dtype);
      auto bytes_of = [&](int32_t r, int32_t c, char* out) {
        const float v = logits.values[static_cast<size_t>(r) * cols + c];
        if (dtype == DType::kFloat32) {
          std::memcpy(out, &v, 4);
        } else {
          const uint16_t h = FloatToBFloat16(v);
          std::memcpy(out, &h, 2);
        }
      };
      std::vector<char> whole_host(static_cast<size_t>(rows) * cols * elem);
      for (int32_t r = 0; r < rows; ++r) {
        for (int32_t c = 0; c < cols; ++c) bytes_of(r, c, &whole_host[(static_cast<size_t>(r) * cols + c) * elem]);
      }
      DeviceBytes whole(whole_host.data(), whole_host.size());
      LogitsView whole_view;
      whole_view.data = whole.data;
      whole_view.dtype = dtype;
      whole_view.rows = rows;
      whole_view.cols = whole_view.row_stride = cols;
      whole_view.on_device = true;
      for (size_t l = 0; l < layouts.size(); ++l) {
        std::vector<std::unique_ptr<DeviceBytes>> held;
        LogitsView sharded = whole_view;
        int32_t begin = 0;
        for (size_t s = 0; s < layouts[l].size(); ++s) {
          const int32_t n = layouts[l][s];
          const int64_t stride = n + static_cast<int64_t>(s) * 3 + (l == 0 ? 0 : 5);
          std::vector<char> host(static_cast<size_t>(rows) * stride * elem, 0);
          for (int32_t r = 0; r < rows; ++r) {
            for (int32_t c = 0; c < n; ++c) bytes_of(r, begin + c, &host[(r * stride + c) * elem]);
          }
          held.push_back(std::make_unique<DeviceBytes>(host.data(), host.size()));
          sharded.shards.push_back(LogitsShard{held.back()->data, stride, begin, n, nullptr});
          begin += n;
        }
        ASSERT_EQ(begin, cols);
        sharded.data = sharded.shards[0].data;
        for (size_t k = 0; k < sets.size(); ++k) {
          std::vector<std::string> masks;
          const bool masked = vocab == 129280 && k % 2 == 0;
          Step step = PrefillStep(logits, vocab, rows, 7 + k, sets[k], k == 1 ? 64 : 0, masked, &masks);
          step.logits = whole_view;
          const StepResult from_whole = RunStep(*gpu, step);
          step.logits = sharded;
          const StepResult from_shards = RunStep(*gpu, step);
          for (const RequestResult& r : from_whole.results) EXPECT_TRUE(r.status.ok()) << r.status;
          EXPECT_TRUE(BitwiseSame(from_whole, from_shards))
              << "V " << vocab << " " << DTypeName(dtype) << " layout " << l << " params " << k;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 2 * 3 * 9);

  // A NaN in rank 1's shard fails its row with the message the same NaN sent whole gives.
  const int32_t vocab = 32000;
  HostLogits logits(rows, vocab, 5);
  logits.Row(3)[vocab - 10] = NAN;
  DeviceBytes whole(logits.values.data(), logits.values.size() * 4);
  const int32_t half = vocab / 2;
  std::vector<float> rank0, rank1;
  for (int32_t r = 0; r < rows; ++r) {
    rank0.insert(rank0.end(), logits.Row(r), logits.Row(r) + half);
    rank1.insert(rank1.end(), logits.Row(r) + half, logits.Row(r) + vocab);
  }
  DeviceBytes shard0(rank0.data(), rank0.size() * 4), shard1(rank1.data(), rank1.size() * 4);
  Step step = PrefillStep(logits, vocab, rows, 3, sets[1], 0, false, nullptr);
  step.logits.data = whole.data;
  step.logits.on_device = true;
  const StepResult from_whole = RunStep(*gpu, step);
  step.logits.shards = {LogitsShard{shard0.data, half, 0, half, nullptr},
                        LogitsShard{shard1.data, vocab - half, half, vocab - half, nullptr}};
  step.logits.data = shard0.data;
  const StepResult from_shards = RunStep(*gpu, step);
  ASSERT_FALSE(from_whole.results[3].status.ok());
  EXPECT_TRUE(BitwiseSame(from_whole, from_shards));
  for (int r = 0; r < rows; ++r) EXPECT_EQ(from_shards.results[r].status.ok(), r != 3) << r;
}

}  // namespace
}  // namespace samplerd
