// SPEC 3 step 2's token adjustments (allowed_token_ids, bad_words, min_tokens with
// stop_token_ids, logit_bias) on a backend, through PlanStep and Sample as the server runs
// them. The same tests run on the CPU backend (//sampler:token_adjustments_test) and, built
// with SAMPLERD_TEST_CUDA, on the CUDA backend (//cuda:cuda_token_adjustments_test, tag gpu).
//
// Each row's whole processed distribution is read back as its top logprobs (top_logprobs = V
// on a small vocabulary) and compared with SPEC's arithmetic done here in float64 on the
// adjusted logits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "sampler/test_util.h"
#include "sampler/validate.h"
#ifdef SAMPLERD_TEST_CUDA
#include "cuda/cuda_backend.h"
#else
#include "sampler/cpu_backend.h"
#endif

namespace samplerd {
namespace {

constexpr int32_t kVocab = 12;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::unique_ptr<Backend> MakeBackend() {
#ifdef SAMPLERD_TEST_CUDA
  auto backend = CudaBackend::Create({});
#else
  auto backend = CpuBackend::Create({});
#endif
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::unique_ptr<Backend>(std::move(*backend)) : nullptr;
}

StepResult RunStep(const Step& step) {
  static std::unique_ptr<Backend> backend = MakeBackend();
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{5}; });
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto result = backend->Sample(*plan);
  EXPECT_TRUE(result.ok()) << result.status();
  return std::move(*result);
}

// Emitted row `j` of a result as a map token -> processed logprob (tokens not listed: -inf).
std::map<int32_t, double> Distribution(const RequestResult& r, size_t j) {
  std::map<int32_t, double> out;
  const TopLogprobs& top = r.top_logprobs.at(j);
  for (size_t i = 0; i < top.token_ids.size(); ++i) {
    if (top.token_ids[i] >= 0 && std::isfinite(top.logprobs[i])) {
      out[top.token_ids[i]] = top.logprobs[i];
    }
  }
  return out;
}

// log_softmax of `x` (-inf entries removed) in float64.
std::map<int32_t, double> LogSoftmax(const std::vector<float>& x) {
  double m = -kInf;
  for (float v : x) m = std::max(m, static_cast<double>(v));
  double z = 0.0;
  for (float v : x) z += std::exp(static_cast<double>(v) - m);
  std::map<int32_t, double> out;
  for (size_t t = 0; t < x.size(); ++t) {
    if (x[t] != -std::numeric_limits<float>::infinity()) out[t] = x[t] - m - std::log(z);
  }
  return out;
}

void ExpectSameDistribution(const std::map<int32_t, double>& got,
                            const std::map<int32_t, double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [t, lp] : want) {
    ASSERT_TRUE(got.count(t)) << what << ": token " << t << " missing";
    EXPECT_NEAR(got.at(t), lp, 1e-5) << what << ": token " << t;
  }
}

class TokenAdjustments : public ::testing::Test {
 protected:
  TokenAdjustments() : logits_(8, kVocab, /*seed=*/17, /*scale=*/1.5f) {}
  std::vector<float> Row(int32_t r) const { return logits_.RowVector(r); }
  RequestInputs Prefill(int32_t row) const {
    RequestInputs r = PrefillRequest("p" + std::to_string(row), row, 100 + row);
    r.params.top_logprobs = kVocab;
    return r;
  }
  // A DECODE request over rows [first, first + q) whose drafts are all accepted (golden tokens
  // equal to the drafts: teacher forcing), so every row is emitted with its distribution.
  RequestInputs Decode(int32_t first, const std::vector<int32_t>& drafts) {
    RequestInputs r;
    r.request_id = "d";
    r.first_row = first;
    r.num_rows = static_cast<int32_t>(drafts.size()) + 1;
    r.sample_position = 9;
    r.params.seq_seed = 3;
    r.params.top_logprobs = kVocab;
    r.draft_token_ids = drafts;
    r.golden_token_ids = drafts;
    q_ = HostLogits(static_cast<int32_t>(drafts.size()), kVocab);
    for (float& v : q_.values) v = static_cast<float>(-std::log(kVocab));  // uniform q
    r.drafts.form = DraftDistributions::Form::kDense;
    r.drafts.values = q_.View();
    return r;
  }
  HostLogits logits_;
  HostLogits q_{1, 1};
};

TEST_F(TokenAdjustments, LogitBiasAddsToTheLogits) {
  Step step = MakeStep(StepKind::kPrefill, logits_, kVocab);
  RequestInputs r = Prefill(0);
  r.params.logit_bias = {{3, 2.5f}, {7, -1.25f}, {11, 100.0f}};
  step.requests.push_back(r);
  const StepResult result = RunStep(step);
  ASSERT_TRUE(result.results[0].status.ok()) << result.results[0].status;
  std::vector<float> x = Row(0);
  x[3] += 2.5f;
  x[7] += -1.25f;
  x[11] += 100.0f;
  ExpectSameDistribution(Distribution(result.results[0], 0), LogSoftmax(x), "bias");
  EXPECT_EQ(result.results[0].token_ids[0], 11);  // +100 leaves no room for another token
}

TEST_F(TokenAdjustments, AllowedTokenIdsKeepOnlyThoseAndMeetTheGrammarMask) {
  Step step = MakeStep(StepKind::kPrefill, logits_, kVocab);
  RequestInputs a = Prefill(0);
  a.params.allowed_token_ids = {1, 4, 9, 4};  // a repeat changes nothing
  RequestInputs b = Prefill(1);
  b.params.allowed_token_ids = {1, 4, 9};
  b.allowed_token_masks = {MaskOf(kVocab, {0, 1, 2, 3, 9})};  // grammar: 4 is not allowed
  step.requests = {a, b};
  const StepResult result = RunStep(step);
  std::vector<float> x = Row(0);
  for (int t = 0; t < kVocab; ++t) {
    if (t != 1 && t != 4 && t != 9) x[t] = -std::numeric_limits<float>::infinity();
  }
  ExpectSameDistribution(Distribution(result.results[0], 0), LogSoftmax(x), "allowed");
  std::vector<float> y = Row(1);
  for (int t = 0; t < kVocab; ++t) {
    if (t != 1 && t != 9) y[t] = -std::numeric_limits<float>::infinity();
  }
  ExpectSameDistribution(Distribution(result.results[1], 0), LogSoftmax(y), "allowed and mask");
}

TEST_F(TokenAdjustments, BadWordsBanTheirLastTokenAfterTheirPrefix) {
  Step step = MakeStep(StepKind::kPrefill, logits_, kVocab);
  RequestInputs a = Prefill(0);
  a.output_token_ids = {2, 5};
  a.params.bad_words = {{8}, {5, 6}, {2, 5, 7}, {4, 10}, {1, 2, 5, 3}};
  step.requests.push_back(a);
  const StepResult result = RunStep(step);
  // {8}: always. {5, 6}: the history ends with 5. {2, 5, 7}: ends with 2, 5. {4, 10}: no.
  // {1, 2, 5, 3}: the history is shorter than its prefix.
  std::vector<float> x = Row(0);
  for (int t : {8, 6, 7}) x[t] = -std::numeric_limits<float>::infinity();
  ExpectSameDistribution(Distribution(result.results[0], 0), LogSoftmax(x), "bad words");
}

TEST_F(TokenAdjustments, ABadWordThatADraftCompletesIsBannedInTheNextRow) {
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = Decode(2, {3, 0});
  r.output_token_ids = {9};
  r.params.bad_words = {{3, 8}, {9, 3, 0, 5}};
  step.requests.push_back(r);
  const StepResult result = RunStep(step);
  const RequestResult& out = result.results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  ASSERT_EQ(out.token_ids.size(), 3u);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Row 0 (history 9): nothing. Row 1 (9, 3): 8. Row 2 (9, 3, 0): 5.
  ExpectSameDistribution(Distribution(out, 0), LogSoftmax(Row(2)), "row 0");
  std::vector<float> x1 = Row(3);
  x1[8] = neg_inf;
  ExpectSameDistribution(Distribution(out, 1), LogSoftmax(x1), "row 1");
  std::vector<float> x2 = Row(4);
  x2[5] = neg_inf;
  ExpectSameDistribution(Distribution(out, 2), LogSoftmax(x2), "row 2");
}

TEST_F(TokenAdjustments, MinTokensEndsInsideADecodeStep) {
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = Decode(0, {6, 7, 2});
  r.output_token_ids = {1, 1};
  r.params.min_tokens = 4;
  r.params.stop_token_ids = {0, 11};
  step.requests.push_back(r);
  const StepResult result = RunStep(step);
  const RequestResult& out = result.results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  ASSERT_EQ(out.token_ids.size(), 4u);
  // History lengths 2, 3, 4, 5: the stop ids are banned in rows 0 and 1 only.
  for (int j = 0; j < 4; ++j) {
    std::vector<float> x = Row(j);
    if (j < 2) x[0] = x[11] = -std::numeric_limits<float>::infinity();
    ExpectSameDistribution(Distribution(out, j), LogSoftmax(x), "row " + std::to_string(j));
  }
}

TEST_F(TokenAdjustments, ABiasDoesNotReviveATokenTheGrammarRemoved) {
  Step step = MakeStep(StepKind::kPrefill, logits_, kVocab);
  RequestInputs r = Prefill(0);
  r.allowed_token_masks = {MaskOf(kVocab, {0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11})};  // not 2
  r.params.logit_bias = {{2, 100.0f}, {5, 1.0f}};
  r.params.bad_words = {{5}};  // a ban wins over a bias
  step.requests.push_back(r);
  const StepResult result = RunStep(step);
  std::vector<float> x = Row(0);
  x[2] = x[5] = -std::numeric_limits<float>::infinity();
  ExpectSameDistribution(Distribution(result.results[0], 0), LogSoftmax(x), "masked + bias");
}

TEST_F(TokenAdjustments, AdjustmentsThatLeaveNoTokenFailTheirRequestOnly) {
  Step step = MakeStep(StepKind::kPrefill, logits_, kVocab);
  RequestInputs a = Prefill(0);
  a.params.allowed_token_ids = {3, 4};
  a.params.bad_words = {{3}};
  a.params.min_tokens = 1;
  a.params.stop_token_ids = {4};
  RequestInputs b = Prefill(1);
  b.params.logit_bias = {{0, 1.0f}};
  step.requests = {a, b};
  const StepResult result = RunStep(step);
  EXPECT_EQ(result.results[0].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.results[0].status.message().find("no token left"), std::string::npos)
      << result.results[0].status;
  EXPECT_TRUE(result.results[1].status.ok()) << result.results[1].status;
}

TEST_F(TokenAdjustments, PenaltiesFollowTheAdjustments) {
  // SPEC 3: step 2 (the bias) before step 3 (repetition divides the biased value).
  Step step = MakeStep(StepKind::kPrefill, logits_, kVocab);
  RequestInputs r = Prefill(0);
  r.params.logit_bias = {{4, 3.0f}, {6, -2.0f}};
  r.params.repetition_penalty = 2.0f;
  r.params.presence_penalty = 0.5f;
  r.prompt_token_ids = {4};
  r.output_token_ids = {6, 6};
  step.requests.push_back(r);
  const StepResult result = RunStep(step);
  std::vector<float> x = Row(0);
  for (int t : {4, 6}) {
    x[t] = t == 4 ? x[t] + 3.0f : x[t] - 2.0f;
    x[t] = x[t] > 0.0f ? x[t] / 2.0f : x[t] * 2.0f;
  }
  x[6] -= 0.5f;
  ExpectSameDistribution(Distribution(result.results[0], 0), LogSoftmax(x), "bias then penalty");
}

// DRY (SPEC 3 step 3), after the penalties: SPEC's worked example as a PREFILL row's context,
// with a repetition penalty in front, and a DECODE request whose drafts extend the repeat row
// by row. The penalty entries are computed once on the host (token_updates.cc), so both
// backends apply the same float32 values.
TEST_F(TokenAdjustments, DryPenalisesTheTokenThatWouldContinueARepeat) {
  Step step = MakeStep(StepKind::kPrefill, logits_, kVocab);
  RequestInputs r = Prefill(0);
  r.prompt_token_ids = {5, 6, 7, 9, 5, 6};
  r.output_token_ids = {7};
  r.params.repetition_penalty = 1.25f;
  r.params.dry_multiplier = 1.0f;
  r.params.dry_base = 2.0f;
  step.requests.push_back(r);
  const StepResult result = RunStep(step);
  ASSERT_TRUE(result.results[0].status.ok()) << result.results[0].status;
  std::vector<float> x = Row(0);
  for (int32_t t : {5, 6, 7, 9}) x[t] = x[t] > 0 ? x[t] / 1.25f : x[t] * 1.25f;
  x[9] -= 2.0f;  // c ends 5, 6, 7 as at index 0: the match of 3 before 9, 2^(3 - 2)
  ExpectSameDistribution(Distribution(result.results[0], 0), LogSoftmax(x), "dry");
}

TEST_F(TokenAdjustments, DryInADecodeStepCountsTheDraftsBeforeEachRow) {
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = Decode(/*first=*/1, /*drafts=*/{7, 9});
  r.prompt_token_ids = {5, 6, 7, 9, 5};
  r.output_token_ids = {6};
  r.params.dry_multiplier = 0.5f;
  r.params.dry_base = 2.0f;
  step.requests.push_back(r);
  const StepResult result = RunStep(step);
  ASSERT_TRUE(result.results[0].status.ok()) << result.results[0].status;
  ASSERT_EQ(result.results[0].token_ids.size(), 3u);
  // Row 0: c ends 5, 6 (i = 1: 6, 5 before 7): x[7] -= 0.5 * 2^0. Row 1, after the draft 7:
  // c ends 5, 6, 7: x[9] -= 0.5 * 2^1. Row 2, after 7, 9: c = 5 6 7 9 5 6 7 9, i = 3 matches
  // 9, 7, 6, 5 before 5: x[5] -= 0.5 * 2^2.
  const std::vector<std::pair<int32_t, float>> want = {{7, 0.5f}, {9, 1.0f}, {5, 2.0f}};
  for (int j = 0; j < 3; ++j) {
    std::vector<float> x = Row(1 + j);
    x[want[j].first] -= want[j].second;
    ExpectSameDistribution(Distribution(result.results[0], j), LogSoftmax(x),
                           "decode row " + std::to_string(j));
  }
}

}  // namespace
}  // namespace samplerd
