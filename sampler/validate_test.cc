#include "sampler/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "sampler/test_util.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

SeedSource FixedSeeds() {
  return [] { return uint64_t{0xABCDEF}; };
}

absl::Status ParamsError(const SamplingParams& params) {
  return NormalizeParams(params, Limits{}, "requests[0].params").status();
}

void ExpectRejected(const SamplingParams& params, const std::string& field) {
  const absl::Status status = ParamsError(params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(std::string(status.message()), HasSubstr(field));
}

TEST(NormalizeParams, DefaultsAreSpecDefaults) {
  auto p = NormalizeParams({}, Limits{}, "p");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->temperature, 1.0f);
  EXPECT_EQ(p->top_p, 1.0f);
  EXPECT_EQ(p->top_k, -1);
  EXPECT_EQ(p->min_p, 0.0f);
  EXPECT_EQ(p->repetition_penalty, 1.0f);
  EXPECT_EQ(p->presence_penalty, 0.0f);
  EXPECT_EQ(p->frequency_penalty, 0.0f);
  EXPECT_EQ(p->top_logprobs, 0);
}

TEST(NormalizeParams, TemperatureZeroBecomesEpsAndTurnsFiltersOff) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_p = 0.5f;
  params.top_k = 3;
  params.min_p = 0.2f;
  auto p = NormalizeParams(params, Limits{}, "p");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->temperature, kSamplingEps);
  EXPECT_EQ(p->top_p, 1.0f);
  EXPECT_EQ(p->top_k, -1);
  EXPECT_EQ(p->min_p, 0.0f);
}

TEST(NormalizeParams, TemperatureAtEpsKeepsFilters) {
  SamplingParams params;
  params.temperature = 1e-5f;
  params.top_k = 3;
  auto p = NormalizeParams(params, Limits{}, "p");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->top_k, 3);
}

TEST(NormalizeParams, RejectsEachOutOfRangeParameter) {
  SamplingParams p;
  p = {}; p.temperature = -0.1f; ExpectRejected(p, "params.temperature");
  p = {}; p.temperature = std::nanf(""); ExpectRejected(p, "params.temperature");
  p = {}; p.top_p = 0.0f; ExpectRejected(p, "params.top_p");
  p = {}; p.top_p = 1.01f; ExpectRejected(p, "params.top_p");
  p = {}; p.top_k = 0; ExpectRejected(p, "params.top_k");
  p = {}; p.top_k = -2; ExpectRejected(p, "params.top_k");
  p = {}; p.min_p = -0.01f; ExpectRejected(p, "params.min_p");
  p = {}; p.min_p = 1.5f; ExpectRejected(p, "params.min_p");
  p = {}; p.repetition_penalty = 0.0f; ExpectRejected(p, "params.repetition_penalty");
  p = {}; p.repetition_penalty = -1.0f; ExpectRejected(p, "params.repetition_penalty");
  p = {}; p.presence_penalty = 2.5f; ExpectRejected(p, "params.presence_penalty");
  p = {}; p.frequency_penalty = -2.01f; ExpectRejected(p, "params.frequency_penalty");
  p = {}; p.top_logprobs = -1; ExpectRejected(p, "params.top_logprobs");
  p = {}; p.top_logprobs = 65; ExpectRejected(p, "params.top_logprobs");
}

TEST(NormalizeParams, AcceptsRangeEnds) {
  SamplingParams p;
  p.top_p = 1.0f;
  p.top_k = -1;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.top_logprobs = 64;
  EXPECT_TRUE(ParamsError(p).ok());
}

class PlanStepTest : public ::testing::Test {
 protected:
  PlanStepTest() : logits_(8, 40, 1) {}
  Step Prefill(std::vector<RequestInputs> requests) {
    Step step = MakeStep(StepKind::kPrefill, logits_, 37);
    step.requests = std::move(requests);
    return step;
  }
  absl::StatusOr<StepPlan> Plan(const Step& step) {
    return PlanStep(step, Limits{}, FixedSeeds());
  }
  HostLogits logits_;
};

TEST_F(PlanStepTest, MissingSeedIsDrawnAndReported) {
  RequestInputs r = PrefillRequest("a", 0, 0);
  r.params.seq_seed.reset();
  Step step = Prefill({r});
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->requests[0].params.seq_seed, 0xABCDEFu);
  EXPECT_EQ(plan->requests[0].seed, 0xABCDEFu);
}

TEST_F(PlanStepTest, RejectsVocabLargerThanColumns) {
  Step step = Prefill({PrefillRequest("a", 0, 1)});
  step.vocab_size = 41;
  auto plan = Plan(step);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("inputs.vocab_size"));
}

TEST_F(PlanStepTest, RowOutsideTensorFailsTheStep) {
  Step step = Prefill({PrefillRequest("a", 8, 1)});
  auto plan = Plan(step);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("inputs.requests[0].row"));
}

TEST_F(PlanStepTest, OverlappingRowsFailTheStep) {
  RequestInputs a = PrefillRequest("a", 3, 1);
  RequestInputs b = PrefillRequest("b", 7, 1);
  b.prompt_first_row = 2;
  b.prompt_targets = {1, 2};  // rows 2, 3: row 3 is a's
  Step step = Prefill({a, b});
  auto plan = Plan(step);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("also read by inputs.requests[0]"));
}

TEST_F(PlanStepTest, BadRequestFailsOnlyItself) {
  RequestInputs good = PrefillRequest("good", 0, 1);
  RequestInputs bad = PrefillRequest("bad", 1, 1);
  bad.params.top_p = 2.0f;
  auto step = Prefill({good, bad});
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->requests[0].status.ok());
  EXPECT_EQ(plan->requests[1].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan->requests[1].status.message()), HasSubstr("requests[1].params.top_p"));
}

TEST_F(PlanStepTest, RejectsTokenIdsOutsideVocabulary) {
  struct Case {
    std::function<void(RequestInputs&)> set;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](RequestInputs& r) { r.golden_token_ids = {37}; }, "golden_token_ids[0]"},
      {[](RequestInputs& r) { r.golden_token_ids = {-2}; }, "golden_token_ids[0]"},
      {[](RequestInputs& r) { r.prompt_token_ids = {1, -1}; }, "prompt_token_ids[1]"},
      {[](RequestInputs& r) { r.output_token_ids = {40}; }, "output_token_ids[0]"},
      {[](RequestInputs& r) {
         r.prompt_first_row = 4;
         r.prompt_targets = {3, 99};
       },
       "prompt_targets[1]"},
  };
  for (const Case& c : cases) {
    RequestInputs r = PrefillRequest("a", 0, 1);
    c.set(r);
    Step step = Prefill({r});
    auto plan = Plan(step);
    ASSERT_TRUE(plan.ok()) << c.field;
    EXPECT_EQ(plan->requests[0].status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(plan->requests[0].status.message()), HasSubstr(c.field));
  }
}

TEST_F(PlanStepTest, RejectsShortMaskAndWrongMaskCount) {
  RequestInputs r = PrefillRequest("a", 0, 1);
  r.allowed_token_masks = {std::string(4, '\xff')};  // 1 word; V = 37 needs 2
  Step step = Prefill({r});
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(std::string(plan->requests[0].status.message()),
              HasSubstr("allowed_token_masks[0]"));

  r.allowed_token_masks = {MaskOf(37, {1}), MaskOf(37, {2})};
  step = Prefill({r});
  plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(std::string(plan->requests[0].status.message()), HasSubstr("allowed_token_masks"));
  EXPECT_THAT(std::string(plan->requests[0].status.message()), HasSubstr("2 masks for 1"));
}

TEST_F(PlanStepTest, GoldenTokensAreRejectedInDraftSteps) {
  RequestInputs r;
  r.request_id = "d";
  r.rows = {0};
  r.draft_indices = {1};
  r.golden_token_ids = {3};
  Step step = MakeStep(StepKind::kDraft, logits_, 37);
  step.requests = {r};
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(std::string(plan->requests[0].status.message()), HasSubstr("golden_token_ids"));
}

TEST_F(PlanStepTest, DecodeNeedsOneDraftPerVerifyRow) {
  RequestInputs r;
  r.request_id = "x";
  r.first_row = 0;
  r.num_rows = 3;
  r.draft_token_ids = {1};
  Step step = MakeStep(StepKind::kDecode, logits_, 37);
  step.requests = {r};
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(std::string(plan->requests[0].status.message()), HasSubstr("draft_token_ids"));
}

TEST_F(PlanStepTest, DecodeRowPositionsFollowSpec) {
  RequestInputs r;
  r.request_id = "x";
  r.first_row = 2;
  r.num_rows = 6;
  r.sample_position = 50;
  r.draft_token_ids = {1, 2, 3, 4, 5};
  r.params.seq_seed = 1;
  Step step = MakeStep(StepKind::kDecode, logits_, 37);
  step.requests = {r};
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(plan->requests[0].status.ok()) << plan->requests[0].status;
  ASSERT_EQ(plan->requests[0].sampled_rows.size(), 6u);
  EXPECT_EQ(plan->requests[0].sampled_rows[2].position, 20000088u);
  EXPECT_EQ(plan->requests[0].sampled_rows[2].row, 4);
}

TEST_F(PlanStepTest, DraftStepsUseTheDraftSeedDomain) {
  RequestInputs r;
  r.request_id = "d";
  r.rows = {0, 1};
  r.draft_indices = {1, 2};
  r.sample_position = 50;
  r.last_valid_offset = 3;
  r.params.seq_seed = 9;
  Step step = MakeStep(StepKind::kDraft, logits_, 37);
  step.requests = {r};
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->requests[0].seed, 9u + 1000000007u);
  EXPECT_EQ(plan->requests[0].params.seq_seed, 9u);
  EXPECT_EQ(plan->requests[0].sampled_rows[1].position, 55u);
}

}  // namespace
}  // namespace samplerd
