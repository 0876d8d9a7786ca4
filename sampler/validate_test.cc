#include "sampler/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "sampler/memory_budget.h"
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

// Each token adjustment field is checked in one function (PlanAdjustments' checks): its
// length against the server's limit, its values, its ids.
TEST_F(PlanStepTest, RejectsEachFaultyTokenAdjustment) {
  const float nan = std::nanf("");
  struct Case {
    std::function<void(SamplingParams&)> set;
    std::string field;
  };
  Limits small;
  small.max_token_list = 3;
  const std::vector<Case> cases = {
      {[](SamplingParams& p) { p.logit_bias = {{5, 100.5f}}; }, "params.logit_bias[5]"},
      {[](SamplingParams& p) { p.logit_bias = {{1, 0.0f}, {6, -101.0f}}; }, "params.logit_bias[6]"},
      {[&](SamplingParams& p) { p.logit_bias = {{2, nan}}; }, "params.logit_bias[2]"},
      {[](SamplingParams& p) { p.logit_bias = {{2, INFINITY}}; }, "params.logit_bias[2]"},
      {[](SamplingParams& p) { p.bad_words = {{1, 2}, {}}; }, "params.bad_words[1].token_ids"},
      {[](SamplingParams& p) { p.min_tokens = -1; }, "params.min_tokens"},
      {[](SamplingParams& p) { p.allowed_token_ids = {1, 2, 3, 4}; }, "params.allowed_token_ids"},
      {[](SamplingParams& p) { p.stop_token_ids = {1, 2, 3, 4}; }, "params.stop_token_ids"},
      {[](SamplingParams& p) { p.logit_bias = {{1, 0}, {2, 0}, {3, 0}, {4, 0}}; },
       "params.logit_bias"},
      {[](SamplingParams& p) { p.bad_words = {{1, 2}, {3, 4}}; }, "params.bad_words"},
      // DRY (SPEC 2): multiplier in [0, 100], base in [1, 4], allowed length >= 1, range >= 0,
      // breakers a token list.
      {[](SamplingParams& p) { p.dry_multiplier = -0.5f; }, "params.dry_multiplier"},
      {[](SamplingParams& p) { p.dry_multiplier = 100.5f; }, "params.dry_multiplier"},
      {[&](SamplingParams& p) { p.dry_multiplier = nan; }, "params.dry_multiplier"},
      {[](SamplingParams& p) { p.dry_multiplier = 1.0f; p.dry_base = 0.99f; }, "params.dry_base"},
      {[](SamplingParams& p) { p.dry_base = 4.01f; }, "params.dry_base"},
      {[&](SamplingParams& p) { p.dry_base = nan; }, "params.dry_base"},
      {[](SamplingParams& p) { p.dry_allowed_length = 0; }, "params.dry_allowed_length"},
      {[](SamplingParams& p) { p.dry_range = -1; }, "params.dry_range"},
      {[](SamplingParams& p) { p.dry_sequence_breakers = {1, 2, 3, 4}; },
       "params.dry_sequence_breakers"},
  };
  for (const Case& c : cases) {
    RequestInputs r = PrefillRequest("a", 0, 1);
    c.set(r.params);
    Step step = Prefill({r, PrefillRequest("b", 1, 1)});
    auto plan = PlanStep(step, small, FixedSeeds());
    ASSERT_TRUE(plan.ok()) << c.field;
    const absl::Status& status = plan->requests[0].status;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(status.message()), HasSubstr("requests[0]." + c.field));
    EXPECT_TRUE(plan->requests[1].status.ok()) << c.field;
  }
  // The range's ends, and lists at the limit, are accepted.
  RequestInputs ok = PrefillRequest("a", 0, 1);
  ok.params.logit_bias = {{1, -100.0f}, {2, 100.0f}, {3, 0.0f}};
  ok.params.dry_multiplier = 100.0f;
  ok.params.dry_base = 4.0f;
  ok.params.dry_allowed_length = 1;
  ok.params.dry_sequence_breakers = {1, 2, 3};
  ok.params.bad_words = {{1}, {2, 3}};
  ok.params.allowed_token_ids = {1, 2, 3};
  ok.params.min_tokens = 0;
  Step step = Prefill({ok});
  auto plan = PlanStep(step, small, FixedSeeds());
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->requests[0].status.ok()) << plan->requests[0].status;
}

TEST_F(PlanStepTest, RejectsAdjustmentTokenIdsOutsideVocabulary) {
  struct Case {
    std::function<void(RequestInputs&)> set;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](RequestInputs& r) { r.params.allowed_token_ids = {3, 37}; },
       "params.allowed_token_ids[1]"},
      {[](RequestInputs& r) { r.params.stop_token_ids = {-1}; }, "params.stop_token_ids[0]"},
      {[](RequestInputs& r) { r.params.bad_words = {{1}, {2, 40}}; },
       "params.bad_words[1].token_ids[1]"},
      {[](RequestInputs& r) { r.params.logit_bias = {{37, 1.0f}}; }, "params.logit_bias[37]"},
      {[](RequestInputs& r) { r.params.logit_bias = {{4, 1.0f}, {4, 2.0f}}; },
       "params.logit_bias[4]"},
      {[](RequestInputs& r) { r.params.dry_sequence_breakers = {2, 37}; },
       "params.dry_sequence_breakers[1]"},
  };
  for (const Case& c : cases) {
    RequestInputs r = PrefillRequest("a", 0, 1);
    c.set(r);
    Step step = Prefill({r, PrefillRequest("b", 1, 1)});
    auto plan = Plan(step);
    ASSERT_TRUE(plan.ok()) << c.field;
    EXPECT_EQ(plan->requests[0].status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(plan->requests[0].status.message()), HasSubstr("requests[0]." + c.field));
    EXPECT_TRUE(plan->requests[1].status.ok()) << c.field;  // the other request is unharmed
  }
}

TEST_F(PlanStepTest, AllowedTokenMasksAreBoundedPerStep) {
  // V = 37: 8 bytes a mask. Three requests, one with a grammar mask too (two masks).
  Limits limits;
  limits.max_step_mask_bytes = 24;
  RequestInputs a = PrefillRequest("a", 0, 1);
  a.params.allowed_token_ids = {1};
  RequestInputs b = PrefillRequest("b", 1, 1);
  b.params.allowed_token_ids = {2};
  b.allowed_token_masks = {MaskOf(37, {2, 3})};
  RequestInputs c = PrefillRequest("c", 2, 1);
  c.params.allowed_token_ids = {3};
  Step step = Prefill({a, b, c});
  auto plan = PlanStep(step, limits, FixedSeeds());
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->requests[0].status.ok());
  EXPECT_TRUE(plan->requests[1].status.ok());
  EXPECT_EQ(plan->requests[2].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(plan->requests[2].status.message()),
              HasSubstr("requests[2].params.allowed_token_ids"));
  // b's row mask is the AND of its grammar mask and its allowed ids: token 2 only.
  const unsigned char* mask = plan->requests[1].sampled_rows[0].mask;
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(mask[0], 0x04);
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

// Issue 45: the row updates are made before the backend, each request's history once, from
// the request budget; a request whose history does not fit fails alone.
TEST_F(PlanStepTest, PreparedRowUpdatesEqualTheRowsOwnAndAreBounded) {
  auto decode = [](const std::string& id, int32_t first_row, size_t context) {
    RequestInputs r;
    r.request_id = id;
    r.first_row = first_row;
    r.num_rows = 4;
    r.draft_token_ids = {1, 5, 1};
    for (size_t i = 0; i < context; ++i) {
      r.prompt_token_ids.push_back(static_cast<int32_t>((i * 7) % 37));
    }
    r.output_token_ids = {3, 5, 3};
    r.params.repetition_penalty = 1.2f;
    r.params.frequency_penalty = 0.5f;
    r.params.dry_multiplier = 0.8f;
    r.params.seq_seed = 1;
    return r;
  };
  Step step = MakeStep(StepKind::kDecode, logits_, 37);
  step.requests = {decode("a", 0, 100), decode("b", 4, 5000)};
  auto plan = Plan(step);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(plan->requests[1].status.ok()) << plan->requests[1].status;
  std::vector<std::vector<TokenUpdate>> own;
  for (int32_t j = 0; j < 4; ++j) own.push_back(*plan->requests[1].RowUpdates(step.kind, j));
  // Unbounded: every row prepared, equal to what the row makes itself.
  std::vector<std::shared_ptr<const void>> leases;
  PrepareRowUpdates(*plan, Limits{}, nullptr, &leases);
  ASSERT_EQ(plan->requests[1].prepared_updates.size(), 4u);
  for (int32_t j = 0; j < 4; ++j) {
    const std::vector<TokenUpdate>& got = *plan->requests[1].RowUpdates(step.kind, j);
    ASSERT_EQ(got.size(), own[j].size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token, own[j][i].token);
      EXPECT_EQ(got[i].flags, own[j][i].flags);
      EXPECT_EQ(got[i].count, own[j][i].count);
      EXPECT_EQ(got[i].late_bias, own[j][i].late_bias);
    }
  }
  // A budget that holds the short request's history and not the long one's: the long one
  // fails alone, naming its field; nothing is left reserved once the leases go.
  MemoryBudget budget(64 << 10);
  auto again = Plan(step);
  ASSERT_TRUE(again.ok());
  std::vector<std::shared_ptr<const void>> held;
  PrepareRowUpdates(*again, Limits{}, &budget, &held);
  EXPECT_TRUE(again->requests[0].status.ok()) << again->requests[0].status;
  EXPECT_EQ(again->requests[0].prepared_updates.size(), 4u);
  EXPECT_EQ(again->requests[1].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(again->requests[1].status.message()),
              HasSubstr("requests[1].prompt_token_ids"));
  EXPECT_GT(budget.used(), 0);
  held.clear();
  EXPECT_EQ(budget.used(), 0);
  // The work bound: context tokens x rows.
  Limits tight;
  tight.max_context_token_rows = 4 * 200;
  auto bounded = Plan(step);
  ASSERT_TRUE(bounded.ok());
  PrepareRowUpdates(*bounded, tight, nullptr, &held);
  EXPECT_TRUE(bounded->requests[0].status.ok());
  EXPECT_EQ(bounded->requests[1].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(bounded->requests[1].status.message()),
              HasSubstr("--max_context_token_rows"));
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
