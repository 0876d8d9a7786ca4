#include "sampler/cpu_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "sampler/reference_sampler.h"
#include "sampler/row_processor.h"
#include "sampler/spec_rules.h"
#include "sampler/test_util.h"
#include "sampler/validate.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<CpuBackend> MakeBackend(int threads = 2) {
  CpuBackendOptions options;
  options.num_threads = threads;
  auto backend = CpuBackend::Create(options);
  EXPECT_TRUE(backend.ok());
  return std::move(*backend);
}

StepResult RunStep(CpuBackend& backend, const Step& step) {
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{777}; });
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto result = backend.Sample(*plan);
  EXPECT_TRUE(result.ok()) << result.status();
  return std::move(*result);
}

// Bitwise equality of two request results (floats compared by bits: -inf and NaN included).
void ExpectSameResult(const RequestResult& a, const RequestResult& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(a.num_accepted, b.num_accepted);
  EXPECT_EQ(a.seq_seed, b.seq_seed);
  auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> out(v.size());
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
    return out;
  };
  EXPECT_EQ(bits(a.logprobs), bits(b.logprobs));
  EXPECT_EQ(bits(a.sum_smaller_probs), bits(b.sum_smaller_probs));
  EXPECT_EQ(bits(a.prompt_logprobs), bits(b.prompt_logprobs));
  ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
  for (size_t i = 0; i < a.top_logprobs.size(); ++i) {
    EXPECT_EQ(a.top_logprobs[i].token_ids, b.top_logprobs[i].token_ids);
    EXPECT_EQ(bits(a.top_logprobs[i].logprobs), bits(b.top_logprobs[i].logprobs));
  }
}

TEST(CpuBackend, PrefillDrawsFromTheProcessedDistribution) {
  auto backend = MakeBackend();
  HostLogits logits(2, 300, 11);
  Step step = MakeStep(StepKind::kPrefill, logits, 290);
  step.compute_sum_smaller_probs = true;
  RequestInputs r = PrefillRequest("a", 1, /*seed=*/1, /*sample_position=*/41);
  r.params.temperature = 0.7f;
  r.params.top_p = 0.95f;
  r.params.top_k = 50;
  r.params.top_logprobs = 5;
  step.requests = {r};
  const StepResult result = RunStep(*backend, step);
  ASSERT_EQ(result.results.size(), 1u);
  const RequestResult& out = result.results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.seq_seed, 1u);

  // The same row through the reference: the token drawn with U(1, 3 * 41 + 0).
  NormalizedParams params;
  params.temperature = 0.7f;
  params.top_p = 0.95f;
  params.top_k = 50;
  ReferenceOptions options;
  options.vocab_size = 290;
  const ReferenceRow ref = ReferenceProcess(logits.RowVector(1), params, options);
  const double u = UniformDouble(1, 3 * 41);
  EXPECT_EQ(u, 0.47725830829076243);
  ASSERT_EQ(out.token_ids.size(), 1u);
  EXPECT_EQ(out.token_ids[0], ReferenceDraw(ref, u));
  EXPECT_NEAR(out.logprobs[0], ref.logprobs[out.token_ids[0]], 1e-5);
  ASSERT_EQ(out.top_logprobs.size(), 1u);
  const auto top = ReferenceTop(ref, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(out.top_logprobs[0].token_ids[i], top[i].first);
    EXPECT_NEAR(out.top_logprobs[0].logprobs[i], top[i].second, 1e-5);
  }
  ASSERT_EQ(out.sum_smaller_probs.size(), 1u);
  EXPECT_NEAR(out.sum_smaller_probs[0], ReferenceSumSmaller(ref, out.token_ids[0]), 1e-5);
}

// SPEC 3 step 8 removes p_x < min_p * p_max: a token equal to the bound stays. min_p = 1 keeps
// exactly the tokens tied at the maximum (their weight is exp(0) = 1, the bound itself), on the
// unsorted path (no top-k or top-p) and on the sorted one (top_k). Issue 27: `<` -> `<=`
// survived every other test.
TEST(CpuBackend, MinPKeepsATokenEqualToItsBound) {
  auto backend = MakeBackend();
  HostLogits logits(2, 16, 5, 1.0f);
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < 16; ++t) logits.Row(r)[t] = -static_cast<float>(t % 7) - 1.0f;
    logits.Row(r)[3] = 2.0f;  // tied at the maximum
    logits.Row(r)[9] = 2.0f;
  }
  Step step = MakeStep(StepKind::kPrefill, logits, 16);
  for (int r = 0; r < 2; ++r) {
    RequestInputs q = PrefillRequest(r == 0 ? "unsorted" : "sorted", r, 11 + r);
    q.params.min_p = 1.0f;
    q.params.top_logprobs = 3;
    if (r == 1) q.params.top_k = 8;
    step.requests.push_back(q);
  }
  const StepResult result = RunStep(*backend, step);
  for (const RequestResult& out : result.results) {
    SCOPED_TRACE(out.request_id);
    ASSERT_TRUE(out.status.ok()) << out.status;
    ASSERT_EQ(out.top_logprobs.size(), 1u);
    const TopLogprobs& top = out.top_logprobs[0];
    EXPECT_EQ(top.token_ids, (std::vector<int32_t>{3, 9, -1}));
    EXPECT_NEAR(top.logprobs[0], std::log(0.5), 1e-6);
    EXPECT_NEAR(top.logprobs[1], std::log(0.5), 1e-6);
    EXPECT_TRUE(out.token_ids[0] == 3 || out.token_ids[0] == 9);
  }
}

TEST(CpuBackend, ServerDrawsAndEchoesSeedWhenNoneSent) {
  auto backend = MakeBackend();
  HostLogits logits(1, 50, 2);
  Step step = MakeStep(StepKind::kPrefill, logits, 50);
  RequestInputs r = PrefillRequest("a", 0, 0);
  r.params.seq_seed.reset();
  step.requests = {r};
  const StepResult first = RunStep(*backend, step);
  EXPECT_EQ(first.results[0].seq_seed, 777u);
  // Replaying with the echoed seed gives the same token.
  step.requests[0].params.seq_seed = first.results[0].seq_seed;
  const StepResult replay = RunStep(*backend, step);
  EXPECT_EQ(replay.results[0].token_ids, first.results[0].token_ids);
}

TEST(CpuBackend, GoldenTokenReplacesTheSampleInPrefill) {
  auto backend = MakeBackend();
  HostLogits logits(1, 64, 3);
  Step step = MakeStep(StepKind::kPrefill, logits, 64);
  RequestInputs r = PrefillRequest("g", 0, 5);
  r.params.top_k = 4;
  r.golden_token_ids = {17};
  step.requests = {r};
  const StepResult result = RunStep(*backend, step);
  const RequestResult& out = result.results[0];
  ASSERT_TRUE(out.status.ok());
  EXPECT_EQ(out.token_ids, std::vector<int32_t>{17});
  NormalizedParams params;
  params.top_k = 4;
  ReferenceOptions options;
  options.vocab_size = 64;
  const ReferenceRow ref = ReferenceProcess(logits.RowVector(0), params, options);
  // The golden token's processed logprob (-inf when top-k removed it).
  if (ref.logprobs[17] == -std::numeric_limits<double>::infinity()) {
    EXPECT_EQ(out.logprobs[0], -std::numeric_limits<float>::infinity());
  } else {
    EXPECT_NEAR(out.logprobs[0], ref.logprobs[17], 1e-5);
  }
}

TEST(CpuBackend, PromptLogprobsUseOnlyPaddingTemperatureTopPTopK) {
  auto backend = MakeBackend();
  // 9,000 prompt rows: crosses the 8,192-row chunk boundary.
  const int32_t prompt_rows = 9000;
  const int32_t vocab = 24;
  HostLogits logits(prompt_rows + 1, vocab + 2, 4);
  Step step = MakeStep(StepKind::kPrefill, logits, vocab);
  RequestInputs r = PrefillRequest("p", prompt_rows, 9);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.9f;
  r.params.top_k = 12;
  r.params.min_p = 0.3f;                // not applied to prompt logprobs
  r.params.repetition_penalty = 1.5f;   // nor penalties
  r.prompt_token_ids = {1, 2, 3};
  r.prompt_first_row = 0;
  std::mt19937 rng(4);
  for (int32_t i = 0; i < prompt_rows; ++i) r.prompt_targets.push_back(rng() % vocab);
  r.allowed_token_masks = {MaskOf(vocab, {0})};  // masks apply to the sampled row only
  step.requests = {r};
  const StepResult result = RunStep(*backend, step);
  const RequestResult& out = result.results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.token_ids, std::vector<int32_t>{0});
  ASSERT_EQ(out.prompt_logprobs.size(), static_cast<size_t>(prompt_rows));
  NormalizedParams params;
  params.temperature = 0.8f;
  params.top_p = 0.9f;
  params.top_k = 12;
  params.min_p = 0.3f;
  ReferenceOptions options;
  options.vocab_size = vocab;
  options.prompt_mode = true;
  int finite = 0;
  for (int32_t i = 0; i < prompt_rows; ++i) {
    const ReferenceRow ref = ReferenceProcess(logits.RowVector(i), params, options);
    if (ref.top_p_margin < 1e-6) continue;
    const double want = ref.logprobs[r.prompt_targets[i]];
    if (want == -std::numeric_limits<double>::infinity()) {
      ASSERT_EQ(out.prompt_logprobs[i], -std::numeric_limits<float>::infinity()) << i;
    } else {
      ASSERT_NEAR(out.prompt_logprobs[i], want, 1e-5) << i;
      ++finite;
    }
  }
  EXPECT_GT(finite, prompt_rows / 10);  // enough finite values compared, not only -inf
}

Step BatchOf(const HostLogits& logits, int32_t vocab, const std::vector<int>& order) {
  Step step = MakeStep(StepKind::kPrefill, logits, vocab);
  step.compute_sum_smaller_probs = true;
  for (int i : order) {
    RequestInputs r = PrefillRequest("req" + std::to_string(i), i, 1000 + i, 41 + i);
    r.params.temperature = 0.5f + 0.02f * i;
    if (i % 3 == 0) r.params.top_p = 0.9f;
    if (i % 4 == 1) r.params.top_k = 1 + i;
    if (i % 5 == 2) r.params.min_p = 0.05f;
    r.params.top_logprobs = i % 6;
    r.output_token_ids = {i % vocab, (3 * i) % vocab};
    r.params.frequency_penalty = 0.1f;
    step.requests.push_back(r);
  }
  return step;
}

TEST(CpuBackend, BatchInvariantBitwise) {
  const int32_t vocab = 5000;
  HostLogits logits(64, vocab, 12);
  std::vector<int> order(64);
  for (int i = 0; i < 64; ++i) order[i] = i;
  std::mt19937 rng(5);
  std::shuffle(order.begin(), order.end(), rng);
  auto backend = MakeBackend(3);
  const StepResult batched = RunStep(*backend, BatchOf(logits, vocab, order));
  auto single_backend = MakeBackend(1);
  for (size_t k = 0; k < order.size(); ++k) {
    const StepResult alone = RunStep(*single_backend, BatchOf(logits, vocab, {order[k]}));
    SCOPED_TRACE(order[k]);
    ExpectSameResult(batched.results[k], alone.results[0]);
  }
}

TEST(CpuBackend, RepeatedRunsAreBitwiseIdentical) {
  const int32_t vocab = 3000;
  HostLogits logits(16, vocab, 13);
  std::vector<int> order(16);
  for (int i = 0; i < 16; ++i) order[i] = i;
  auto backend = MakeBackend(2);
  const StepResult a = RunStep(*backend, BatchOf(logits, vocab, order));
  const StepResult b = RunStep(*backend, BatchOf(logits, vocab, order));
  for (size_t k = 0; k < order.size(); ++k) ExpectSameResult(a.results[k], b.results[k]);
}

TEST(CpuBackend, FaultsFailOnlyTheirRequest) {
  const int32_t vocab = 100;
  HostLogits logits(6, vocab, 14);
  logits.Row(1)[7] = std::nanf("");
  Step step = MakeStep(StepKind::kPrefill, logits, vocab);
  step.requests.push_back(PrefillRequest("ok0", 0, 1));
  step.requests.push_back(PrefillRequest("nan", 1, 1));
  RequestInputs bad_param = PrefillRequest("badparam", 2, 1);
  bad_param.params.top_k = 0;
  step.requests.push_back(bad_param);
  RequestInputs bad_token = PrefillRequest("badtoken", 3, 1);
  bad_token.output_token_ids = {vocab};
  step.requests.push_back(bad_token);
  RequestInputs no_token = PrefillRequest("masked", 4, 1);
  no_token.allowed_token_masks = {MaskOf(vocab, {})};
  step.requests.push_back(no_token);
  step.requests.push_back(PrefillRequest("ok5", 5, 1));
  auto backend = MakeBackend();
  const StepResult result = RunStep(*backend, step);
  ASSERT_EQ(result.results.size(), 6u);
  EXPECT_THAT(std::string(result.results[1].status.message()), HasSubstr("logits row 1"));
  EXPECT_THAT(std::string(result.results[2].status.message()), HasSubstr("params.top_k"));
  EXPECT_THAT(std::string(result.results[3].status.message()), HasSubstr("output_token_ids[0]"));
  EXPECT_THAT(std::string(result.results[4].status.message()), HasSubstr("no token left"));
  for (int i = 1; i <= 4; ++i) {
    EXPECT_EQ(result.results[i].status.code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_TRUE(result.results[i].token_ids.empty()) << i;
  }
  // The healthy requests are answered exactly as when alone.
  for (int i : {0, 5}) {
    Step alone = MakeStep(StepKind::kPrefill, logits, vocab);
    alone.requests = {step.requests[i]};
    const StepResult single = RunStep(*backend, alone);
    ExpectSameResult(result.results[i], single.results[0]);
    EXPECT_TRUE(result.results[i].status.ok());
  }
}

// Draft tensors in device memory (issue 47) are the CUDA backend's: here each such request
// fails alone with FAILED_PRECONDITION naming its tensor (nothing is read through the
// pointer, which here points nowhere), and a device top-N row longer than the kernels' lookup
// takes is refused by the request check on every backend.
TEST(CpuBackend, DeviceDraftsFailOnlyTheirRequest) {
  const int32_t vocab = 100;
  HostLogits logits(6, vocab, 14);
  HostLogits host_q(1, vocab, 15);
  Step step = MakeStep(StepKind::kDecode, logits, vocab);
  for (int i = 0; i < 3; ++i) {
    RequestInputs r;
    r.request_id = "r" + std::to_string(i);
    r.first_row = 2 * i;
    r.num_rows = 2;
    r.params.seq_seed = 3;
    r.draft_token_ids = {5};
    r.drafts.form = DraftDistributions::Form::kDense;
    r.drafts.values = host_q.View();
    step.requests.push_back(r);
  }
  static const char kNowhere[1] = {0};
  step.requests[0].drafts.values.data = kNowhere;  // "device memory": never dereferenced here
  step.requests[0].drafts.values.on_device = true;
  RequestInputs& topn = step.requests[2];
  topn.drafts.form = DraftDistributions::Form::kTopN;
  topn.drafts.values.data = kNowhere;
  topn.drafts.values.on_device = true;
  topn.drafts.values.cols = topn.drafts.values.row_stride = kMaxDeviceTopNDraft + 1;
  topn.drafts.token_ids.assign(kMaxDeviceTopNDraft + 1, 1);
  auto backend = MakeBackend();
  const StepResult result = RunStep(*backend, step);
  EXPECT_EQ(result.results[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.results[0].status.message()),
              HasSubstr("requests[0].draft_logprobs: device memory needs the CUDA backend"));
  EXPECT_TRUE(result.results[1].status.ok()) << result.results[1].status;
  EXPECT_EQ(result.results[2].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.results[2].status.message()),
              HasSubstr("draft_topn.values.cols: 257 entries a row"));
}

TEST(CpuBackend, APromptRowFaultFailsOnlyItsRequest) {
  // Request 0's prompt rows hold a NaN; request 1, after it, is answered as when alone.
  const int32_t vocab = 50;
  HostLogits logits(6, vocab, 16);
  logits.Row(1)[3] = std::nanf("");
  RequestInputs a = PrefillRequest("a", 2, 1);
  a.prompt_first_row = 0;
  a.prompt_targets = {4, 5};
  RequestInputs b = PrefillRequest("b", 5, 2);
  b.prompt_first_row = 3;
  b.prompt_targets = {7, 8};
  b.params.top_logprobs = 2;
  Step step = MakeStep(StepKind::kPrefill, logits, vocab);
  step.requests = {a, b};
  auto backend = MakeBackend();
  const StepResult both = RunStep(*backend, step);
  EXPECT_THAT(std::string(both.results[0].status.message()), HasSubstr("logits row 1"));
  EXPECT_TRUE(both.results[0].token_ids.empty());
  step.requests = {b};
  const StepResult alone = RunStep(*backend, step);
  ExpectSameResult(both.results[1], alone.results[0]);
}

TEST(CpuBackend, Bf16AndFp16LogitsMatchTheirFloatValues) {
  const int32_t vocab = 2000;
  HostLogits logits(2, vocab, 15);
  std::vector<uint16_t> bf16(logits.values.size()), fp16(logits.values.size());
  HostLogits as_bf16(2, vocab), as_fp16(2, vocab);
  for (size_t i = 0; i < logits.values.size(); ++i) {
    bf16[i] = FloatToBFloat16(logits.values[i]);
    fp16[i] = FloatToHalf(logits.values[i]);
    as_bf16.values[i] = BFloat16ToFloat(bf16[i]);
    as_fp16.values[i] = HalfToFloat(fp16[i]);
  }
  auto backend = MakeBackend();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const bool is_bf16 = dtype == DType::kBFloat16;
    Step step = MakeStep(StepKind::kPrefill, is_bf16 ? as_bf16 : as_fp16, vocab);
    step.requests = {PrefillRequest("a", 0, 3), PrefillRequest("b", 1, 4)};
    step.requests[0].params.top_logprobs = 3;
    const StepResult from_float = RunStep(*backend, step);
    step.logits.dtype = dtype;
    step.logits.data = is_bf16 ? bf16.data() : fp16.data();
    const StepResult from_half = RunStep(*backend, step);
    for (int k = 0; k < 2; ++k) ExpectSameResult(from_float.results[k], from_half.results[k]);
  }
}

}  // namespace
}  // namespace samplerd
