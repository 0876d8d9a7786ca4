// SPEC 6's rule for NaN or +inf in a draft row, as cases every backend must answer alike: a
// DECODE step per case whose request 0 sends (or has pooled) a draft row with NaN or +inf in
// an entry verification reads, or in one it never reads, or only in padding columns or under
// -inf, plus request 1, a valid DECODE request that must be answered whatever request 0 holds.
// Used by decode_test (CPU: the expected statuses) and cuda_backend_test (CUDA against CPU).
//
//   for (DraftRuleCase& c : DraftRuleCases()) {
//     if (c.prepare_pool) c.prepare_pool(backend->draft_pool());
//     StepResult result = ...PlanStep(c.step) ... backend->Sample(plan);
//     EXPECT_EQ(result.results[0].status.code(), c.code);
//   }
#ifndef SAMPLERD_SAMPLER_DRAFT_RULE_CASES_H_
#define SAMPLERD_SAMPLER_DRAFT_RULE_CASES_H_

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "sampler/draft_pool.h"
#include "sampler/dtype.h"
#include "sampler/test_util.h"
#include "sampler/types.h"

namespace samplerd {

struct DraftRuleCase {
  std::string what;
  Step step;  // views into `data`
  // Runs before the step (pooled cases store request 0's host draft rows here).
  std::function<void(DraftPool&)> prepare_pool;
  absl::StatusCode code = absl::StatusCode::kOk;  // request 0's; request 1 is always OK
  std::string message;  // a substring of request 0's message ("" when OK)
  // What the step's views point into.
  std::vector<std::shared_ptr<HostLogits>> data;
  std::shared_ptr<std::vector<uint16_t>> bf16;
};

namespace draft_rule_internal {

constexpr int32_t kVocab = 70;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Request 0 verifies 2 drafts at rows 0-2 with top_k 4 (verification reads q only at the
// draft and, after a rejection, over the target's 4 kept tokens: token 69's entry is never
// read when 69 is not among them); request 1 is a plain q = 1 DECODE request at row 5.
inline std::vector<RequestInputs> Requests(const std::string& id) {
  RequestInputs r;
  r.request_id = id;
  r.first_row = 0;
  r.num_rows = 3;
  r.sample_position = 11;
  r.params.seq_seed = 77;
  r.params.top_k = 4;
  r.draft_token_ids = {3, 5};
  RequestInputs other;
  other.request_id = "other";
  other.first_row = 5;
  other.num_rows = 1;
  other.sample_position = 4;
  other.params.seq_seed = 78;
  return {r, other};
}

// Logits whose rows 0-2 keep tokens 0-3 first (large logits), so 69 is outside top_k 4.
inline std::shared_ptr<HostLogits> Logits() {
  auto logits = std::make_shared<HostLogits>(8, kVocab, 2501, 1.0f);
  for (int32_t r = 0; r < 3; ++r) {
    for (int32_t t = 0; t < 4; ++t) logits->Row(r)[t] = 10.0f - t;
  }
  return logits;
}

}  // namespace draft_rule_internal

inline std::vector<DraftRuleCase> DraftRuleCases() {
  using namespace draft_rule_internal;  // NOLINT: this header's own constants
  std::vector<DraftRuleCase> cases;
  const std::string bad_row = "holds NaN at entry ";
  // Dense draft rows [2, cols]: -inf except a few finite values, then one planted value.
  auto dense = [&](const std::string& what, int32_t cols, int32_t row, int32_t col, float value,
                   absl::StatusCode code, const std::string& message) {
    DraftRuleCase c;
    c.what = what;
    auto logits = Logits();
    auto q = std::make_shared<HostLogits>(2, cols);
    for (float& v : q->values) v = -kInf;
    for (int32_t j = 0; j < 2; ++j) {
      for (int32_t t = 0; t < 6; ++t) q->Row(j)[t] = -1.5f - 0.25f * t;
    }
    q->Row(row)[col] = value;
    c.step = MakeStep(StepKind::kDecode, *logits, kVocab);
    c.step.requests = Requests("dense");
    c.step.requests[0].drafts.form = DraftDistributions::Form::kDense;
    c.step.requests[0].drafts.values = q->View();
    c.code = code;
    c.message = message;
    c.data = {logits, q};
    cases.push_back(std::move(c));
  };
  const absl::StatusCode bad = absl::StatusCode::kInvalidArgument;
  const absl::StatusCode ok = absl::StatusCode::kOk;
  dense("dense NaN at the draft itself (read)", kVocab, 0, 3, kNaN, bad,
        "requests[0].draft_logprobs: draft row 0 " + bad_row + "3");
  dense("dense NaN at a token outside the kept set (never read)", kVocab, 1, 69, kNaN, bad,
        "requests[0].draft_logprobs: draft row 1 " + bad_row + "69");
  dense("dense +inf never read", kVocab, 1, 40, kInf, bad,
        "requests[0].draft_logprobs: draft row 1 holds +inf at entry 40");
  dense("dense NaN in a padding column only", kVocab + 3, 0, kVocab + 1, kNaN, ok, "");
  dense("dense -inf never read", kVocab, 1, 40, -kInf, ok, "");

  // The same row as bf16: NaN never read.
  {
    DraftRuleCase c;
    c.what = "dense bf16 NaN never read";
    auto logits = Logits();
    c.bf16 = std::make_shared<std::vector<uint16_t>>(2 * kVocab, FloatToBFloat16(-kInf));
    for (int32_t j = 0; j < 2; ++j) {
      for (int32_t t = 0; t < 6; ++t) (*c.bf16)[j * kVocab + t] = FloatToBFloat16(-1.5f - 0.25f * t);
    }
    (*c.bf16)[kVocab + 50] = 0x7FC0;  // bf16 quiet NaN
    c.step = MakeStep(StepKind::kDecode, *logits, kVocab);
    c.step.requests = Requests("bf16");
    LogitsView view;
    view.data = c.bf16->data();
    view.dtype = DType::kBFloat16;
    view.rows = 2;
    view.cols = kVocab;
    view.row_stride = kVocab;
    c.step.requests[0].drafts.form = DraftDistributions::Form::kDense;
    c.step.requests[0].drafts.values = view;
    c.code = bad;
    c.message = "requests[0].draft_logprobs: draft row 1 " + bad_row + "50";
    c.data = {logits};
    cases.push_back(std::move(c));
  }

  // Top-N rows of 4: ids and values; one planted value.
  auto topn = [&](const std::string& what, std::vector<int32_t> ids, int32_t at, float value,
                  absl::StatusCode code, const std::string& message) {
    DraftRuleCase c;
    c.what = what;
    auto logits = Logits();
    auto values = std::make_shared<HostLogits>(2, 4);
    for (int32_t i = 0; i < 8; ++i) values->values[i] = -1.0f - 0.5f * (i % 4);
    values->values[at] = value;
    c.step = MakeStep(StepKind::kDecode, *logits, kVocab);
    c.step.requests = Requests("topn");
    c.step.requests[0].drafts.form = DraftDistributions::Form::kTopN;
    c.step.requests[0].drafts.values = values->View();
    c.step.requests[0].drafts.token_ids = std::move(ids);
    c.code = code;
    c.message = message;
    c.data = {logits, values};
    cases.push_back(std::move(c));
  };
  topn("top-N NaN at a token outside the kept set (never read)", {3, 1, 2, 69, 5, 0, 1, 2}, 3,
       kNaN, bad, "requests[0].draft_topn.values: draft row 0 " + bad_row + "3");
  topn("top-N NaN beside id -1", {3, 1, 2, 0, 5, -1, 1, 2}, 5, kNaN, bad,
       "requests[0].draft_topn.values: draft row 1 " + bad_row + "1");
  topn("top-N +inf at the draft (read)", {3, 1, 2, 0, 5, 0, 1, 2}, 4, kInf, bad,
       "requests[0].draft_topn.values: draft row 1 holds +inf at entry 0");
  topn("top-N finite and -inf", {3, 1, 2, 0, 5, 0, 1, 2}, 2, -kInf, ok, "");

  // Pooled host rows (as a DRAFT step on the CPU backend stores them), one of them planted.
  auto pooled = [&](const std::string& what, int32_t draft, int32_t entry, float value,
                    absl::StatusCode code, const std::string& message) {
    DraftRuleCase c;
    c.what = what;
    auto logits = Logits();
    c.step = MakeStep(StepKind::kDecode, *logits, kVocab);
    c.step.requests = Requests("pooled");
    c.step.requests[0].drafts.form = DraftDistributions::Form::kPool;
    c.prepare_pool = [draft, entry, value](DraftPool& pool) {
      std::vector<std::pair<int32_t, DraftRow>> rows;
      for (int32_t d = 1; d <= 2; ++d) {
        DraftRow row;
        row.logprobs.assign(kVocab, -kInf);
        for (int32_t t = 0; t < 6; ++t) row.logprobs[t] = -1.5f - 0.25f * t;
        if (d == draft) row.logprobs[entry] = value;
        rows.emplace_back(d, std::move(row));
      }
      const absl::Status stored = pool.Store(DraftPoolKey("", "pooled"), std::move(rows));
      if (!stored.ok()) std::abort();  // a 1 MiB pool holds 2 rows of 70 values
    };
    c.code = code;
    c.message = message;
    c.data = {logits};
    cases.push_back(std::move(c));
  };
  pooled("pooled NaN never read", 2, 60, kNaN, bad,
         "requests[0]: pooled draft 2: draft row 1 " + bad_row + "60");
  pooled("pooled finite and -inf", 2, 60, -kInf, ok, "");
  return cases;
}

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_DRAFT_RULE_CASES_H_
