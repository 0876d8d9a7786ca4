// Issue 50 on the CPU backend: top-nσ (SPEC 3 step 4), XTC (step 8, its own keyed draw) and
// raw logprobs (SPEC 7): SPEC's worked examples, the boundary band, XTC replayed from its key,
// raw logprobs equal to the row's log_softmax, the parameter checks, and random steps mixing
// all three with the other parameters against the float64 reference sampler.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <functional>
#include <random>

#include "sampler/cpu_backend.h"
#include "sampler/reference_sampler.h"
#include "sampler/spec_rules.h"
#include "sampler/test_util.h"
#include "sampler/validate.h"

namespace samplerd {
namespace {

// SPEC 3 step 8's key, written out from SPEC (not through XtcUniform, which it checks).
double SpecXtcU(uint64_t seed, uint64_t position) {
  return UniformDouble(seed + 3000000019ULL, position);
}

using ::testing::HasSubstr;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::unique_ptr<CpuBackend> Backend() {
  auto backend = CpuBackend::Create(CpuBackendOptions{});
  EXPECT_TRUE(backend.ok());
  return std::move(*backend);
}

StepResult RunOn(CpuBackend& backend, const Step& step) {
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{5}; });
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto result = backend.Sample(*plan);
  EXPECT_TRUE(result.ok()) << result.status();
  return std::move(*result);
}

// SPEC 3 step 8's worked example as logits: p = [0.5, 0.3, 0.15, 0.05].
std::vector<float> XtcExampleLogits() {
  return {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
}

// One PREFILL request on a one-row step of `values`.
StepResult PrefillOne(const std::vector<float>& values, const SamplingParams& params,
                      uint64_t position = 41) {
  HostLogits logits(1, static_cast<int32_t>(values.size()));
  logits.values = values;
  Step step = MakeStep(StepKind::kPrefill, logits, logits.cols);
  step.compute_sum_smaller_probs = true;
  RequestInputs r = PrefillRequest("r", 0, params.seq_seed.value_or(1), position);
  r.params = params;
  step.requests.push_back(r);
  auto backend = Backend();
  return RunOn(*backend, step);
}

// SPEC 3 step 4's worked example: finite values [4, 2, 2, 0] (mean 2, sigma sqrt 2), n = 1:
// only the 4 is kept, whatever the draw.
TEST(TopNSigma, SpecWorkedExample) {
  SamplingParams params;
  params.top_n_sigma = 1.0f;
  params.top_logprobs = 4;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    params.seq_seed = seed;
    const StepResult result = PrefillOne({4, 2, 2, 0}, params);
    const RequestResult& r = result.results[0];
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.token_ids, std::vector<int32_t>{0});
    EXPECT_EQ(r.logprobs[0], 0.0f);
    EXPECT_EQ(r.top_logprobs[0].token_ids, (std::vector<int32_t>{0, -1, -1, -1}));
  }
  // -inf values are not among the row's values: [4, 2, 2, 0, -inf] is the same row.
  params.seq_seed = 3;
  EXPECT_EQ(PrefillOne({4, 2, 2, 0, -kInf}, params).results[0].top_logprobs[0].token_ids,
            (std::vector<int32_t>{0, -1, -1, -1}));
}

// The boundary band: a token 1e-3 above M - n·sigma is kept, 1e-3 below it removed (far
// outside the 1e-6 band); the maximum always stays, also where n·sigma is 0.
TEST(TopNSigma, KeepsWhatLiesAboveTheBoundAndTheMaximum) {
  const double sigma = std::sqrt(2.0);
  for (double offset : {-1e-3, 1e-3}) {
    // bound = 2 + offset: n = (4 - bound) / sigma.
    SamplingParams params;
    params.top_n_sigma = static_cast<float>((2.0 - offset) / sigma);
    params.top_logprobs = 4;
    const double bound = 4.0 - static_cast<double>(params.top_n_sigma) * sigma;
    ASSERT_NEAR(bound, 2.0 + offset, 1e-6);
    const RequestResult r = PrefillOne({4, 2, 2, 0}, params).results[0];
    ASSERT_TRUE(r.status.ok());
    const std::vector<int32_t> want =
        bound <= 2.0 ? std::vector<int32_t>{0, 1, 2, -1} : std::vector<int32_t>{0, -1, -1, -1};
    EXPECT_EQ(r.top_logprobs[0].token_ids, want) << "offset " << offset;
  }
  SamplingParams params;
  params.top_n_sigma = 100.0f;
  params.top_logprobs = 3;
  EXPECT_EQ(PrefillOne({1, 1, 1}, params).results[0].top_logprobs[0].token_ids,
            (std::vector<int32_t>{0, 1, 2}));  // sigma 0: M - n·sigma = M keeps all three
}

// SPEC 3 step 8's worked example: p = [0.5, 0.3, 0.15, 0.05], threshold 0.1, the draw below
// the probability: tokens 0 and 1 go, [0, 0, 0.75, 0.25] remains.
TEST(Xtc, SpecWorkedExample) {
  SamplingParams params;
  params.xtc_probability = 1.0f;  // U < 1 always
  params.xtc_threshold = 0.1f;
  params.top_logprobs = 4;
  params.seq_seed = 9;
  const std::vector<float> logits = XtcExampleLogits();
  const RequestResult r = PrefillOne(logits, params).results[0];
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.top_logprobs[0].token_ids, (std::vector<int32_t>{2, 3, -1, -1}));
  EXPECT_NEAR(r.top_logprobs[0].logprobs[0], std::log(0.75), 1e-6);
  EXPECT_NEAR(r.top_logprobs[0].logprobs[1], std::log(0.25), 1e-6);
  EXPECT_TRUE(r.token_ids[0] == 2 || r.token_ids[0] == 3);
  // Fewer than two tokens at or above the threshold: nothing is removed.
  params.xtc_threshold = 0.4f;
  EXPECT_EQ(PrefillOne(logits, params).results[0].top_logprobs[0].token_ids,
            (std::vector<int32_t>{0, 1, 2, 3}));
  // Equal probabilities: the last in the draw's order (the highest id) stays.
  params.xtc_threshold = 0.2f;
  EXPECT_EQ(PrefillOne({0, 0, 0, -kInf}, params).results[0].top_logprobs[0].token_ids,
            (std::vector<int32_t>{2, -1, -1, -1}));
}

// Threshold 0: every kept token has p >= 0, so only the least likely stays, with logprob 0,
// however far below the row's max it lies. Its float weight against that max underflowed to 0
// (exp(-110)), and the row answered token -1 with logprob -inf under status OK (the step
// fuzzer's crash-0e0dc1a9: a DRAFT row read from raw bytes). The survivors are weighed
// against their own max now.
TEST(Xtc, ThresholdZeroKeepsTheLeastLikelyTokenHoweverFarBelow) {
  SamplingParams params;
  params.xtc_probability = 1.0f;
  params.xtc_threshold = 0.0f;
  params.top_logprobs = 2;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    params.seq_seed = seed;
    const RequestResult r = PrefillOne({100, 50, 0, -10}, params).results[0];
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.token_ids, std::vector<int32_t>{3});
    EXPECT_EQ(r.logprobs[0], 0.0f);
    EXPECT_EQ(r.top_logprobs[0].token_ids, (std::vector<int32_t>{3, -1}));
    EXPECT_EQ(r.top_logprobs[0].logprobs[0], 0.0f);
  }
  // Near the max the weights never underflowed: the same rule, the same answer.
  params.seq_seed = 4;
  EXPECT_EQ(PrefillOne({1, 0.5f, 0, -0.25f}, params).results[0].token_ids, std::vector<int32_t>{3});
}

// XTC's draw is U(seed + 3000000019, position): replayed here from its key for 200 seeds at
// probability 0.5, the row is filtered exactly when it falls below (both cases occur), in
// PREFILL, DRAFT (the DRAFT seed domain and position) and each DECODE row (its own position).
TEST(Xtc, TheDrawIsReplayableFromItsKey) {
  const std::vector<float> values = XtcExampleLogits();
  int filtered = 0, kept = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SamplingParams params;
    params.xtc_probability = 0.5f;
    params.top_logprobs = 1;
    params.seq_seed = seed;
    const uint64_t position = 77 + seed;
    const bool expect_filtered = SpecXtcU(seed, position) < 0.5;
    const RequestResult r = PrefillOne(values, params, position).results[0];
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.top_logprobs[0].token_ids[0], expect_filtered ? 2 : 0) << seed;
    (expect_filtered ? filtered : kept) += 1;
  }
  EXPECT_GT(filtered, 60);
  EXPECT_GT(kept, 60);

  // DRAFT rows: seed + kDraftSeedOffset, position sample_position + last_valid_offset + i;
  // DECODE rows: each row j at sample_position + j * 10000019.
  HostLogits logits(3, 4);
  for (int row = 0; row < 3; ++row) std::copy(values.begin(), values.end(), logits.Row(row));
  int draft_checked = 0, decode_checked = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    SamplingParams params;
    params.xtc_probability = 0.5f;
    params.top_logprobs = 1;
    params.seq_seed = seed;
    Step draft = MakeStep(StepKind::kDraft, logits, 4);
    RequestInputs d;
    d.request_id = "d";
    d.rows = {0, 1};
    d.draft_indices = {1, 2};
    d.sample_position = 30;
    d.last_valid_offset = 2;
    d.params = params;
    draft.requests.push_back(d);
    auto backend = Backend();
    const RequestResult dr = RunOn(*backend, draft).results[0];
    ASSERT_TRUE(dr.status.ok()) << dr.status;
    for (int i = 0; i < 2; ++i) {
      const bool f = SpecXtcU(seed + 1000000007ULL, 30 + 2 + (i + 1)) < 0.5;
      EXPECT_EQ(dr.top_logprobs[i].token_ids[0], f ? 2 : 0) << seed << " draft " << i;
      ++draft_checked;
    }
    Step decode = MakeStep(StepKind::kDecode, logits, 4);
    RequestInputs q;
    q.request_id = "q";
    q.first_row = 0;
    q.num_rows = 3;
    q.sample_position = 50;
    q.params = params;
    q.golden_token_ids = {3, 3, 3};  // every row emitted, whatever the draws
    q.draft_token_ids = {3, 3};
    q.drafts.form = DraftDistributions::Form::kDense;
    HostLogits q_rows(2, 4);
    std::fill(q_rows.values.begin(), q_rows.values.end(), std::log(0.25f));
    q.drafts.values = q_rows.View();
    decode.requests.push_back(q);
    const RequestResult qr = RunOn(*backend, decode).results[0];
    ASSERT_TRUE(qr.status.ok()) << qr.status;
    ASSERT_EQ(qr.top_logprobs.size(), 3u);
    for (int j = 0; j < 3; ++j) {
      const bool f = SpecXtcU(seed, 50 + j * 10000019ULL) < 0.5;
      EXPECT_EQ(qr.top_logprobs[j].token_ids[0], f ? 2 : 0) << seed << " decode row " << j;
      ++decode_checked;
    }
  }
  EXPECT_EQ(draft_checked, 120);
  EXPECT_EQ(decode_checked, 180);
}

// DECODE verifies against the distribution the row samples from, XTC applied: a draft that
// XTC removed has p = 0 and is always rejected; its replacement is one of the kept tokens.
TEST(Xtc, VerificationUsesTheFilteredDistribution) {
  HostLogits logits(2, 4);
  const std::vector<float> values = XtcExampleLogits();
  for (int row = 0; row < 2; ++row) std::copy(values.begin(), values.end(), logits.Row(row));
  HostLogits q_rows(1, 4);
  q_rows.values = {std::log(0.97f), std::log(0.01f), std::log(0.01f), std::log(0.01f)};
  auto backend = Backend();
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Step step = MakeStep(StepKind::kDecode, logits, 4);
    RequestInputs r;
    r.request_id = "r";
    r.num_rows = 2;
    r.sample_position = 12;
    r.params.seq_seed = seed;
    r.params.xtc_probability = 1.0f;
    r.draft_token_ids = {0};  // removed by XTC
    r.drafts.form = DraftDistributions::Form::kDense;
    r.drafts.values = q_rows.View();
    step.requests.push_back(r);
    const RequestResult out = RunOn(*backend, step).results[0];
    ASSERT_TRUE(out.status.ok());
    EXPECT_EQ(out.num_accepted, 0);
    ASSERT_EQ(out.token_ids.size(), 1u);
    EXPECT_TRUE(out.token_ids[0] == 2 || out.token_ids[0] == 3) << out.token_ids[0];
  }
}

// RAW logprobs (SPEC 7): the token's, the top list's and the prompt targets' logprobs are the
// row's log_softmax as sent (float64 reference within 1e-6), whatever the mask, bias,
// penalties, temperature and filters did; the token is still drawn from the processed row,
// a golden token reports its raw logprob, and sum_smaller_probs stays processed.
TEST(RawLogprobs, AreTheRowsLogSoftmaxAsSent) {
  const int32_t vocab = 300;
  HostLogits logits(5, vocab, 21, 2.0f);
  logits.Row(0)[7] = -kInf;  // never listed in the raw top list
  Step step = MakeStep(StepKind::kPrefill, logits, vocab);
  step.compute_sum_smaller_probs = true;
  RequestInputs r = PrefillRequest("raw", 4, 31, 90);
  r.params.temperature = 0.6f;
  r.params.top_k = 5;
  r.params.top_logprobs = 6;
  r.params.logit_bias = {{3, 5.0f}};
  r.params.frequency_penalty = 0.5f;
  r.output_token_ids = {1, 1, 2};
  r.params.logprobs_mode = 1;
  r.prompt_first_row = 0;
  r.prompt_targets = {7, 10, 20, 30};
  step.requests.push_back(r);
  RequestInputs processed = r;
  processed.request_id = "processed";
  processed.params.logprobs_mode = 0;
  processed.row = 4;
  auto backend = Backend();
  const StepResult raw_result = RunOn(*backend, step);
  const RequestResult& got = raw_result.results[0];
  ASSERT_TRUE(got.status.ok()) << got.status;
  ReferenceOptions options;
  options.vocab_size = vocab;
  const ReferenceRow ref = ReferenceProcess(logits.RowVector(4), NormalizedParams{}, options);
  EXPECT_NEAR(got.logprobs[0], ref.raw_logprobs[got.token_ids[0]], 1e-6);
  const auto top = ReferenceRawTop(ref, 6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(got.top_logprobs[0].token_ids[i], top[i].first) << i;
    EXPECT_NEAR(got.top_logprobs[0].logprobs[i], top[i].second, 1e-6) << i;
  }
  for (size_t k = 0; k < r.prompt_targets.size(); ++k) {
    const ReferenceRow row = ReferenceProcess(logits.RowVector(k), NormalizedParams{}, options);
    const double want = row.raw_logprobs[r.prompt_targets[k]];
    if (std::isinf(want)) {
      EXPECT_EQ(got.prompt_logprobs[k], -kInf) << k;
    } else {
      EXPECT_NEAR(got.prompt_logprobs[k], want, 1e-6) << k;
    }
  }
  ASSERT_EQ(ReferenceRawTop(ReferenceProcess(logits.RowVector(0), NormalizedParams{}, options),
                            vocab)[vocab - 1].first, -1);  // the -inf token is not listed
  // The same request in PROCESSED mode draws the same token with the same sum_smaller_probs.
  step.requests = {processed};
  const StepResult processed_result = RunOn(*backend, step);
  const RequestResult& p = processed_result.results[0];
  ASSERT_TRUE(p.status.ok());
  EXPECT_EQ(p.token_ids, got.token_ids);
  EXPECT_EQ(p.sum_smaller_probs, got.sum_smaller_probs);
  EXPECT_NE(p.logprobs, got.logprobs);
  // A golden token reports its raw logprob, also one the processed row removed.
  r.golden_token_ids = {299};
  step.requests = {r};
  const StepResult golden_result = RunOn(*backend, step);
  const RequestResult& g = golden_result.results[0];
  ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(g.token_ids, std::vector<int32_t>{299});
  EXPECT_NEAR(g.logprobs[0], ref.raw_logprobs[299], 1e-6);
}

// SPEC 2's ranges, each an error of its request naming the field; a near-zero temperature turns
// top-nσ and XTC off (the row is then greedy).
TEST(FilterParams, AreCheckedAndNormalised) {
  struct Case {
    const char* field;
    std::function<void(SamplingParams&)> set;
  };
  const float nan = std::nanf("");
  const std::vector<Case> cases = {
      {"top_n_sigma", [](SamplingParams& p) { p.top_n_sigma = -0.5f; }},
      {"top_n_sigma", [](SamplingParams& p) { p.top_n_sigma = 100.5f; }},
      {"top_n_sigma", [&](SamplingParams& p) { p.top_n_sigma = nan; }},
      {"xtc_probability", [](SamplingParams& p) { p.xtc_probability = 1.5f; }},
      {"xtc_probability", [&](SamplingParams& p) { p.xtc_probability = nan; }},
      {"xtc_threshold", [](SamplingParams& p) { p.xtc_threshold = -0.1f; }},
      {"xtc_threshold", [&](SamplingParams& p) { p.xtc_threshold = nan; }},
      {"logprobs_mode", [](SamplingParams& p) { p.logprobs_mode = 7; }},
  };
  for (const Case& c : cases) {
    SamplingParams params;
    c.set(params);
    auto normalized = NormalizeParams(params, Limits{}, "requests[0].params");
    ASSERT_FALSE(normalized.ok()) << c.field;
    EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(normalized.status().message()),
                HasSubstr(std::string("requests[0].params.") + c.field));
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.top_n_sigma = 1.0f;
  greedy.xtc_probability = 1.0f;
  auto normalized = NormalizeParams(greedy, Limits{}, "p");
  ASSERT_TRUE(normalized.ok());
  EXPECT_EQ(normalized->top_n_sigma, 0.0f);
  EXPECT_EQ(normalized->xtc_probability, 0.0f);
}

// Random steps mixing top-nσ, XTC and RAW logprobs with temperature, top-p, top-k, min-p and
// penalties: every request's token, logprob and top list as the float64 reference computes
// them (rows within SPEC's bands of a decision skipped and counted).
TEST(Filters, RandomStepsMatchTheReference) {
  const int32_t vocab = 400;
  std::mt19937_64 rng(2026);
  auto backend = Backend();
  int compared = 0, skipped = 0, sigma_on = 0, xtc_acted = 0, raw_on = 0;
  for (int step_index = 0; step_index < 40; ++step_index) {
    HostLogits logits(8, vocab, 1000 + step_index, 2.5f);
    Step step = MakeStep(StepKind::kPrefill, logits, vocab);
    for (int i = 0; i < 8; ++i) {
      RequestInputs r = PrefillRequest("r" + std::to_string(i), i, rng(), 60 + i);
      SamplingParams& p = r.params;
      p.temperature = 0.4f + 0.2f * (rng() % 6);
      if (rng() % 3 == 0) p.top_p = 0.8f;
      if (rng() % 3 == 0) p.top_k = 1 + static_cast<int32_t>(rng() % 40);
      if (rng() % 4 == 0) p.min_p = 0.02f;
      if (rng() % 2 == 0) p.top_n_sigma = 0.5f + 0.25f * (rng() % 8);
      if (rng() % 2 == 0) {
        p.xtc_probability = 0.5f;
        p.xtc_threshold = 0.02f * (1 + rng() % 8);
      }
      p.logprobs_mode = static_cast<int32_t>(rng() % 2);
      p.top_logprobs = 3;
      step.requests.push_back(r);
    }
    const StepResult result = RunOn(*backend, step);
    for (int i = 0; i < 8; ++i) {
      const RequestInputs& r = step.requests[i];
      const RequestResult& got = result.results[i];
      ASSERT_TRUE(got.status.ok()) << got.status;
      auto normalized = NormalizeParams(r.params, Limits{}, "p");
      ASSERT_TRUE(normalized.ok());
      ReferenceOptions options;
      options.vocab_size = vocab;
      options.xtc_u = SpecXtcU(*r.params.seq_seed, 60 + i);
      const ReferenceRow ref = ReferenceProcess(logits.RowVector(i), *normalized, options);
      ASSERT_TRUE(ref.ok);
      double edge = 1.0;
      const int32_t want = ReferenceDraw(
          ref, UniformDouble(*r.params.seq_seed, SequenceNumber(60 + i, DrawCase::kFresh)), &edge);
      sigma_on += r.params.top_n_sigma > 0.0f;
      raw_on += r.params.logprobs_mode == 1;
      xtc_acted += r.params.xtc_probability > 0.0f && options.xtc_u < 0.5;
      if (edge < 1e-6 || ref.top_p_margin < 1e-6 || ref.sigma_margin < 1e-6 ||
          ref.xtc_margin < 1e-6) {
        ++skipped;
        continue;
      }
      ++compared;
      ASSERT_EQ(got.token_ids[0], want) << "step " << step_index << " request " << i;
      const bool raw = r.params.logprobs_mode == 1;
      const auto top = raw ? ReferenceRawTop(ref, 3) : ReferenceTop(ref, 3);
      EXPECT_NEAR(got.logprobs[0], raw ? ref.raw_logprobs[want] : ref.logprobs[want], 1e-5);
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(got.top_logprobs[0].token_ids[k], top[k].first) << step_index << " " << i;
        if (top[k].first >= 0) {
          EXPECT_NEAR(got.top_logprobs[0].logprobs[k], top[k].second, 1e-5);
        }
      }
    }
  }
  std::printf("filters: %d requests compared, %d skipped within a band; top-nσ on %d, XTC "
              "acted on %d, raw %d\n", compared, skipped, sigma_on, xtc_acted, raw_on);
  EXPECT_GT(compared, 280);
  EXPECT_GT(sigma_on, 100);
  EXPECT_GT(xtc_acted, 40);
  EXPECT_GT(raw_on, 100);
}

}  // namespace
}  // namespace samplerd
