// DECODE verification, DRAFT steps and the draft pool on the CPU backend (SPEC sections 1, 4, 6).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "sampler/cpu_backend.h"
#include "sampler/draft_rule_cases.h"
#include "sampler/reference_sampler.h"
#include "sampler/spec_rules.h"
#include "sampler/test_util.h"
#include "sampler/validate.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::unique_ptr<CpuBackend> MakeBackend(int64_t pool_bytes = 1 << 22) {
  CpuBackendOptions options;
  options.num_threads = 2;
  options.draft_pool.capacity_bytes = pool_bytes;
  auto backend = CpuBackend::Create(options);
  EXPECT_TRUE(backend.ok());
  return std::move(*backend);
}

// What a dense CPU pool row of the fixture's 60 values and an entry cost (DraftPool's doc).
int64_t DenseRowBytes() { return 60 * 4 + kRowOverheadBytes; }
int64_t EntryBytes(const std::string& request_id) {
  return kEntryOverheadBytes + static_cast<int64_t>(DraftPoolKey("", request_id).size());
}

StepResult RunStep(CpuBackend& backend, const Step& step) {
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{5}; });
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto result = backend.Sample(*plan);
  EXPECT_TRUE(result.ok()) << result.status();
  return std::move(*result);
}

// The target's processed distribution of one row, as the reference computes it.
ReferenceRow TargetRow(const HostLogits& logits, int32_t row, int32_t vocab,
                       const SamplingParams& sent, const std::string* mask = nullptr) {
  auto params = NormalizeParams(sent, Limits{}, "p");
  EXPECT_TRUE(params.ok());
  ReferenceOptions options;
  options.vocab_size = vocab;
  if (mask != nullptr) options.mask = reinterpret_cast<const unsigned char*>(mask->data());
  return ReferenceProcess(logits.RowVector(row), *params, options);
}

// Dense draft logprobs equal to the target's own processed distribution (q == p).
HostLogits DraftsEqualToTarget(const HostLogits& logits, int32_t first_row, int32_t drafts,
                               int32_t vocab, const SamplingParams& params) {
  HostLogits q(drafts, vocab);
  for (int32_t j = 0; j < drafts; ++j) {
    const ReferenceRow ref = TargetRow(logits, first_row + j, vocab, params);
    for (int32_t t = 0; t < vocab; ++t) q.Row(j)[t] = static_cast<float>(ref.logprobs[t]);
  }
  return q;
}

// The tests' default sampler: temperature 0.8 and top-p 0.9, so drafts meet a filtered target.
RequestInputs TemperedDecodeRequest(const std::string& id, int32_t first_row, int32_t q,
                                    uint64_t seed) {
  RequestInputs r = DecodeRequest(id, first_row, q, seed);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.9f;
  return r;
}

void SendDense(RequestInputs& r, const HostLogits& q) {
  r.drafts.form = DraftDistributions::Form::kDense;
  r.drafts.values = q.View();
}

class Decode : public ::testing::Test {
 protected:
  static constexpr int32_t kVocab = 60;
  Decode() : logits_(16, kVocab, 31, 2.0f) {}
  HostLogits logits_;
};

TEST_F(Decode, DraftsEqualToTargetAreAllAccepted) {
  auto backend = MakeBackend();
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 2, 5, 12345);
  const HostLogits q = DraftsEqualToTarget(logits_, 2, 4, kVocab, r.params);
  for (int j = 0; j < 4; ++j) {
    r.draft_token_ids.push_back(TargetRow(logits_, 2 + j, kVocab, r.params).order[j % 2]);
  }
  SendDense(r, q);
  step.requests = {r};
  const RequestResult out = RunStep(*backend, step).results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.num_accepted, 4);
  ASSERT_EQ(out.token_ids.size(), 5u);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(out.token_ids[j], r.draft_token_ids[j]);
  // The last token is row 4's fresh draw: U(seed, 3 * (50 + 4 * 10000019) + 0).
  const ReferenceRow last = TargetRow(logits_, 6, kVocab, r.params);
  EXPECT_EQ(out.token_ids[4],
            ReferenceDraw(last, UniformDouble(12345, 3 * DecodeRowPosition(50, 4))));
  for (int j = 0; j < 5; ++j) {
    const ReferenceRow row = TargetRow(logits_, 2 + j, kVocab, r.params);
    EXPECT_NEAR(out.logprobs[j], row.logprobs[out.token_ids[j]], 1e-5);
  }
}

TEST_F(Decode, DraftWithZeroTargetProbabilityIsRejectedAndReplacedFromResidual) {
  auto backend = MakeBackend();
  const std::string mask = MaskOf(kVocab, {1, 2, 3, 4, 5, 6, 7, 8});
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 0, 3, 99);
  r.params.top_p = 1.0f;
  r.allowed_token_masks = {mask, "", ""};
  r.draft_token_ids = {20, 3};  // 20 is masked out at row 0: p(20) = 0
  // q puts all of its mass on the draft.
  HostLogits q(2, kVocab);
  std::fill(q.values.begin(), q.values.end(), -std::numeric_limits<float>::infinity());
  q.Row(0)[20] = 0.0f;
  q.Row(1)[3] = 0.0f;
  SendDense(r, q);
  step.requests = {r};
  const RequestResult out = RunStep(*backend, step).results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.num_accepted, 0);
  ASSERT_EQ(out.token_ids.size(), 1u);  // nothing after the first rejection
  // Residual max(0, p - q) = p here: the replacement is p's draw with U(seed, 3 pos + 1).
  const ReferenceRow row0 = TargetRow(logits_, 0, kVocab, r.params, &mask);
  EXPECT_EQ(out.token_ids[0], ReferenceDraw(row0, UniformDouble(99, 3 * 50 + 1)));
  EXPECT_NE(row0.logprobs[out.token_ids[0]], kNegInf);
}

// Issue 27: at the production shape (large V, no top-k) a rejected draft's residual
// max(0, p - q) has far more than 4,096 positive entries, and the CPU backend draws it by
// buckets over a dense copy, a path small-V tests never take. V = 32,768, T = 1, top_p = 1;
// each request's draft row is the target's distribution with N(0, 1) noise on its logits
// (the residual is positive on about half the vocabulary), and its draft token is masked out
// at its row (p(d) = 0: rejected whatever u is). The replacement must be SPEC 5's draw from the
// float64 residual with U(seed, 3 pos + 1) (a draw within 1e-6 of an edge is not judged).
// A draw from p instead of the residual disagrees on most of the 8 requests.
TEST(DecodeLargeVocab, RejectionReplacementDrawsFromTheResidual) {
  constexpr int32_t kV = 32768;
  constexpr int kRequests = 8;
  const HostLogits logits(2 * kRequests, kV, 4242, 2.0f);
  HostLogits q(kRequests, kV);
  std::mt19937_64 rng(99);
  std::normal_distribution<double> noise(0.0, 1.0);
  auto backend = MakeBackend(1 << 24);
  Step step = MakeStep(StepKind::kDecode, logits, kV);
  std::vector<std::string> masks(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    std::vector<double> z(kV);
    double max_z = kNegInf;
    for (int32_t t = 0; t < kV; ++t) {
      z[t] = logits.values[static_cast<size_t>(2 * i) * kV + t] + noise(rng);
      max_z = std::max(max_z, z[t]);
    }
    double sum = 0.0;
    for (double v : z) sum += std::exp(v - max_z);
    for (int32_t t = 0; t < kV; ++t) q.Row(i)[t] = static_cast<float>(z[t] - max_z - std::log(sum));
  }
  for (int i = 0; i < kRequests; ++i) {
    RequestInputs r = TemperedDecodeRequest("r" + std::to_string(i), 2 * i, 2, 1000 + i);
    r.params.temperature = 1.0f;
    r.params.top_p = 1.0f;
    const int32_t draft = 100 + 37 * i;
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < kV; ++t) {
      if (t != draft) allowed.push_back(t);
    }
    masks[i] = MaskOf(kV, allowed);
    r.allowed_token_masks = {masks[i], ""};
    r.draft_token_ids = {draft};
    r.drafts.form = DraftDistributions::Form::kDense;
    r.drafts.values = q.RowsView(i, 1);
    step.requests.push_back(r);
  }
  const StepResult result = RunStep(*backend, step);
  int judged = 0;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const RequestResult& out = result.results[i];
    ASSERT_TRUE(out.status.ok()) << out.status;
    ASSERT_EQ(out.num_accepted, 0);
    ASSERT_EQ(out.token_ids.size(), 1u);
    const ReferenceRow p = TargetRow(logits, 2 * i, kV, step.requests[i].params, &masks[i]);
    // The residual as a reference row (SPEC 5's order: weight descending, ties by id), drawn
    // by the reference's own ReferenceDraw.
    ReferenceRow residual;
    residual.probs.assign(kV, 0.0);
    for (int32_t t = 0; t < kV; ++t) {
      residual.probs[t] = std::max(0.0, p.probs[t] - std::exp(static_cast<double>(q.Row(i)[t])));
      if (residual.probs[t] > 0.0) residual.order.push_back(t);
    }
    ASSERT_GT(residual.order.size(), 4096u) << "the test no longer reaches the bucketed path";
    std::stable_sort(residual.order.begin(), residual.order.end(), [&](int32_t a, int32_t b) {
      return residual.probs[a] > residual.probs[b];
    });
    double edge = 0.0;
    const int32_t want = ReferenceDraw(residual, UniformDouble(1000 + i, 3 * 50 + 1), &edge);
    if (edge < 1e-6) continue;  // SPEC 5's band: either neighbour is right
    ++judged;
    EXPECT_EQ(out.token_ids[0], want);
  }
  EXPECT_GE(judged, kRequests - 1);
}

TEST_F(Decode, MinusOneDraftIsAlwaysRejected) {
  auto backend = MakeBackend();
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 0, 2, 7);
  const HostLogits q = DraftsEqualToTarget(logits_, 0, 1, kVocab, r.params);
  r.draft_token_ids = {-1};
  SendDense(r, q);
  step.requests = {r};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    step.requests[0].params.seq_seed = seed;
    const RequestResult out = RunStep(*backend, step).results[0];
    ASSERT_TRUE(out.status.ok());
    EXPECT_EQ(out.num_accepted, 0);
    EXPECT_EQ(out.token_ids.size(), 1u);
  }
}

TEST_F(Decode, GoldenTokensDecideAcceptanceAndOutput) {
  auto backend = MakeBackend();
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 0, 4, 3);
  const HostLogits q = DraftsEqualToTarget(logits_, 0, 3, kVocab, r.params);
  r.draft_token_ids = {11, 12, 13};
  r.golden_token_ids = {11, 40};  // row 0 accepts (draft == golden); row 1 rejects, emits 40
  SendDense(r, q);
  step.requests = {r};
  const RequestResult out = RunStep(*backend, step).results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.num_accepted, 1);
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{11, 40}));
  const ReferenceRow row1 = TargetRow(logits_, 1, kVocab, r.params);
  if (row1.logprobs[40] == kNegInf) {
    EXPECT_EQ(out.logprobs[1], -std::numeric_limits<float>::infinity());
  } else {
    EXPECT_NEAR(out.logprobs[1], row1.logprobs[40], 1e-5);
  }
  // Golden on every row, drafts all matching: the fresh draw of the last row is replaced too.
  step.requests[0].golden_token_ids = {11, 12, 13, 9};
  const RequestResult forced = RunStep(*backend, step).results[0];
  EXPECT_EQ(forced.num_accepted, 3);
  EXPECT_EQ(forced.token_ids, (std::vector<int32_t>{11, 12, 13, 9}));
}

TEST_F(Decode, NothingIsEmittedAfterTheFirstRejection) {
  auto backend = MakeBackend();
  const std::string mask = MaskOf(kVocab, {0, 1, 2});
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 0, 4, 8);
  HostLogits q = DraftsEqualToTarget(logits_, 0, 3, kVocab, r.params);
  const ReferenceRow row0 = TargetRow(logits_, 0, kVocab, r.params);
  const ReferenceRow row2 = TargetRow(logits_, 2, kVocab, r.params);
  // Row 0 accepts (q == p); row 1's draft 30 is masked (rejected); row 2 would accept.
  r.draft_token_ids = {row0.order[0], 30, row2.order[0]};
  r.allowed_token_masks = {"", mask, "", ""};
  SendDense(r, q);
  step.requests = {r};
  const RequestResult out = RunStep(*backend, step).results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.num_accepted, 1);
  ASSERT_EQ(out.token_ids.size(), 2u);
  EXPECT_EQ(out.token_ids[0], row0.order[0]);
  EXPECT_LE(out.token_ids[1], 2);  // the replacement obeys row 1's mask
}

TEST_F(Decode, TopNDraftsOutsideTheDraftSupportAreRejected) {
  auto backend = MakeBackend();
  Step step = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 0, 2, 4);
  const ReferenceRow row0 = TargetRow(logits_, 0, kVocab, r.params);
  // The draft's top-N: its best tokens are the target's, with the same logprobs (q == p there).
  const int32_t n = 4;
  HostLogits values(1, n);
  r.drafts.form = DraftDistributions::Form::kTopN;
  for (int32_t i = 0; i < n; ++i) {
    values.values[i] = static_cast<float>(row0.logprobs[row0.order[i]]);
    r.drafts.token_ids.push_back(row0.order[i]);
  }
  r.drafts.values = values.View();
  r.draft_token_ids = {row0.order[0]};
  step.requests = {r};
  RequestResult out = RunStep(*backend, step).results[0];
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.num_accepted, 1);  // q(d) == p(d): accepted whatever u
  // A kept target token the draft's top-N does not hold: q(d) = 0, rejected.
  step.requests[0].draft_token_ids = {row0.order[n]};
  out = RunStep(*backend, step).results[0];
  ASSERT_TRUE(out.status.ok());
  EXPECT_EQ(out.num_accepted, 0);
}

TEST_F(Decode, BatchInvariantBitwise) {
  auto backend = MakeBackend();
  std::vector<RequestInputs> requests;
  std::vector<HostLogits> drafts;
  drafts.reserve(3);
  const int32_t q_lens[3] = {6, 6, 4};
  int32_t first = 0;
  for (int i = 0; i < 3; ++i) {
    RequestInputs r = TemperedDecodeRequest("r" + std::to_string(i), first, q_lens[i], 100 + i);
    r.output_token_ids = {1, 2};
    r.params.presence_penalty = 0.3f;
    r.params.top_logprobs = 3;
    drafts.push_back(DraftsEqualToTarget(logits_, first, q_lens[i] - 1, kVocab, r.params));
    std::mt19937 rng(i);
    for (int j = 0; j < q_lens[i] - 1; ++j) r.draft_token_ids.push_back(rng() % kVocab);
    SendDense(r, drafts.back());
    requests.push_back(r);
    first += q_lens[i];
  }
  Step together = MakeStep(StepKind::kDecode, logits_, kVocab);
  together.compute_sum_smaller_probs = true;
  together.requests = {requests[2], requests[0], requests[1]};
  const StepResult batched = RunStep(*backend, together);
  for (int k = 0; k < 3; ++k) {
    Step alone = together;
    alone.requests = {together.requests[k]};
    const RequestResult single = RunStep(*backend, alone).results[0];
    const RequestResult& in_batch = batched.results[k];
    ASSERT_TRUE(single.status.ok());
    EXPECT_EQ(single.token_ids, in_batch.token_ids);
    EXPECT_EQ(single.num_accepted, in_batch.num_accepted);
    EXPECT_EQ(single.logprobs, in_batch.logprobs);
    EXPECT_EQ(single.sum_smaller_probs, in_batch.sum_smaller_probs);
  }
}

TEST_F(Decode, DraftStepSamplesInDraftSeedDomainAndFillsThePool) {
  auto backend = MakeBackend();
  Step draft = MakeStep(StepKind::kDraft, logits_, kVocab);
  RequestInputs d;
  d.request_id = "a";
  d.rows = {8, 9};
  d.draft_indices = {1, 2};
  d.sample_position = 50;
  d.last_valid_offset = 2;
  d.params.seq_seed = 77;
  d.params.temperature = 0.9f;
  draft.requests = {d};
  const RequestResult drafted = RunStep(*backend, draft).results[0];
  ASSERT_TRUE(drafted.status.ok()) << drafted.status;
  EXPECT_EQ(drafted.seq_seed, 77u);  // the base seed, not seed + 1000000007
  ASSERT_EQ(drafted.token_ids.size(), 2u);
  for (int j = 0; j < 2; ++j) {
    const ReferenceRow ref = TargetRow(logits_, 8 + j, kVocab, d.params);
    const double u = UniformDouble(77 + 1000000007ULL, 3 * (50 + 2 + (j + 1)));
    EXPECT_EQ(drafted.token_ids[j], ReferenceDraw(ref, u));
  }
  EXPECT_EQ(backend->draft_pool().UsedBytes(), 2 * DenseRowBytes() + EntryBytes("a"));

  // The DECODE step verifies against the pooled distributions, consuming them.
  Step decode = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 0, 3, 77);
  r.draft_token_ids = drafted.token_ids;
  decode.requests = {r};
  const RequestResult verified = RunStep(*backend, decode).results[0];
  ASSERT_TRUE(verified.status.ok()) << verified.status;
  EXPECT_GE(verified.token_ids.size(), 1u);
  EXPECT_EQ(backend->draft_pool().UsedBytes(), 0);
  // What it verified against was the DRAFT step's processed distributions: the same DECODE
  // with those sent inline (the float64 reference's, as float32) gives the same answer.
  const HostLogits q = DraftsEqualToTarget(logits_, 8, 2, kVocab, d.params);
  Step inline_decode = decode;
  SendDense(inline_decode.requests[0], q);
  auto fresh = MakeBackend();
  const RequestResult by_inline = RunStep(*fresh, inline_decode).results[0];
  ASSERT_TRUE(by_inline.status.ok()) << by_inline.status;
  EXPECT_EQ(verified.num_accepted, by_inline.num_accepted);
  EXPECT_EQ(verified.token_ids, by_inline.token_ids);
  const RequestResult again = RunStep(*backend, decode).results[0];
  EXPECT_EQ(again.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status.message()), HasSubstr("draft pool holds no drafts"));
}

TEST_F(Decode, PoolStoresTopNFormWithForceTopN) {
  auto backend = MakeBackend();
  Step draft = MakeStep(StepKind::kDraft, logits_, kVocab);
  draft.force_top_n = 8;
  RequestInputs d;
  d.request_id = "a";
  d.rows = {0};
  d.draft_indices = {1};
  d.params.seq_seed = 1;
  draft.requests = {d};
  ASSERT_TRUE(RunStep(*backend, draft).results[0].status.ok());
  // 8 values + 8 ids, the row's and the entry's bookkeeping.
  EXPECT_EQ(backend->draft_pool().UsedBytes(), 8 * 4 + 8 * 4 + kRowOverheadBytes + EntryBytes("a"));
}

TEST_F(Decode, FullPoolIsResourceExhaustedForTheRequestThatDoesNotFit) {
  // Room for three rows and two entries: r0 (two rows) fits, r1 then does not.
  auto backend = MakeBackend(3 * DenseRowBytes() + 2 * EntryBytes("r0"));
  Step draft = MakeStep(StepKind::kDraft, logits_, kVocab);
  for (int i = 0; i < 2; ++i) {
    RequestInputs d;
    d.request_id = "r" + std::to_string(i);
    d.rows = {2 * i, 2 * i + 1};
    d.draft_indices = {1, 2};
    d.params.seq_seed = i;
    draft.requests.push_back(d);
  }
  const StepResult result = RunStep(*backend, draft);
  EXPECT_TRUE(result.results[0].status.ok());
  EXPECT_EQ(result.results[1].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(result.results[1].status.message()), HasSubstr("draft pool full"));
  EXPECT_TRUE(result.results[1].token_ids.empty());
  // Releasing a request frees its space for others.
  EXPECT_EQ(backend->draft_pool().Release(DraftPoolKey("", "r0")), 2);
  EXPECT_EQ(backend->draft_pool().UsedBytes(), 0);
  draft.requests = {draft.requests[1]};
  EXPECT_TRUE(RunStep(*backend, draft).results[0].status.ok());
}

TEST_F(Decode, MissingDraftIndexInPoolIsFailedPrecondition) {
  auto backend = MakeBackend();
  Step draft = MakeStep(StepKind::kDraft, logits_, kVocab);
  RequestInputs d;
  d.request_id = "a";
  d.rows = {0};
  d.draft_indices = {1};
  d.params.seq_seed = 1;
  draft.requests = {d};
  ASSERT_TRUE(RunStep(*backend, draft).results[0].status.ok());
  Step decode = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("a", 0, 3, 1);
  r.draft_token_ids = {1, 2};
  decode.requests = {r, TemperedDecodeRequest("b", 3, 1, 2)};
  const StepResult result = RunStep(*backend, decode);
  EXPECT_EQ(result.results[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.results[0].status.message()), HasSubstr("no draft 2"));
  EXPECT_TRUE(result.results[1].status.ok());  // q = 1 needs no drafts
}


// Pool keys are scoped by client: another client's DECODE with the same request id finds
// nothing, and consumes nothing.
TEST_F(Decode, PoolEntriesAreScopedByClient) {
  auto backend = MakeBackend();
  Step draft = MakeStep(StepKind::kDraft, logits_, kVocab);
  draft.pool_scope = "client-A";
  RequestInputs d;
  d.request_id = "same-id";
  d.rows = {8, 9};
  d.draft_indices = {1, 2};
  d.params.seq_seed = 3;
  draft.requests = {d};
  const RequestResult drafted = RunStep(*backend, draft).results[0];
  ASSERT_TRUE(drafted.status.ok()) << drafted.status;

  Step decode = MakeStep(StepKind::kDecode, logits_, kVocab);
  RequestInputs r = TemperedDecodeRequest("same-id", 0, 3, 3);
  r.draft_token_ids = drafted.token_ids;
  decode.requests = {r};
  decode.pool_scope = "client-B";
  const RequestResult other = RunStep(*backend, decode).results[0];
  EXPECT_EQ(other.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend->draft_pool().Entries(), 1);  // A's drafts are still there
  decode.pool_scope = "client-A";
  EXPECT_TRUE(RunStep(*backend, decode).results[0].status.ok());
  EXPECT_EQ(backend->draft_pool().Entries(), 0);
}

// An entry whose DECODE never comes expires after the pool's ttl (a crashed worker's drafts).
// SPEC 6: NaN or +inf anywhere in a sent or pooled draft row fails its request (read or not),
// padding and -inf do not, and the step's other request is answered. cuda_backend_test runs
// the same cases on the GPU against these answers.
TEST(DraftRule, NaNOrPosInfAnywhereInADraftRowFailsOnlyItsRequest) {
  for (DraftRuleCase& c : DraftRuleCases()) {
    SCOPED_TRACE(c.what);
    auto backend = MakeBackend();
    if (c.prepare_pool) c.prepare_pool(backend->draft_pool());
    const StepResult result = RunStep(*backend, c.step);
    ASSERT_EQ(result.results.size(), 2u);
    EXPECT_EQ(result.results[0].status.code(), c.code) << result.results[0].status;
    EXPECT_THAT(std::string(result.results[0].status.message()), HasSubstr(c.message));
    if (c.code == absl::StatusCode::kOk) EXPECT_EQ(result.results[0].token_ids.size() >= 1, true);
    EXPECT_TRUE(result.results[1].status.ok()) << result.results[1].status;
    EXPECT_EQ(result.results[1].token_ids.size(), 1u);
  }
}

TEST(DraftPoolTest, EntriesExpireAfterTheirTtl) {
  absl::Time now = absl::FromUnixSeconds(1000);
  DraftPoolOptions options;
  options.capacity_bytes = 4 * (10 * 4 + kRowOverheadBytes + kEntryOverheadBytes + 16);
  options.ttl = absl::Seconds(60);
  options.now = [&now] { return now; };
  DraftPool pool(options);
  auto row = [] {
    DraftRow r;
    r.logprobs.assign(10, -1.0f);
    return r;
  };
  for (int i = 0; i < 4; ++i) {
    std::vector<std::pair<int32_t, DraftRow>> rows;
    rows.emplace_back(1, row());
    ASSERT_TRUE(pool.Store(DraftPoolKey("s", std::to_string(i)), std::move(rows)).ok());
  }
  std::vector<std::pair<int32_t, DraftRow>> more;
  more.emplace_back(1, row());
  EXPECT_EQ(pool.Store(DraftPoolKey("s", "x"), std::move(more)).code(),
            absl::StatusCode::kResourceExhausted);
  now += absl::Seconds(59);
  EXPECT_TRUE(pool.Take(DraftPoolKey("s", "0")).ok());  // still alive at 59 s
  now += absl::Seconds(2);                               // the others are 61 s old
  EXPECT_EQ(pool.Take(DraftPoolKey("s", "1")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.Expire(), 2);
  EXPECT_EQ(pool.UsedBytes(), 0);
  EXPECT_EQ(pool.Entries(), 0);
  // Full capacity is usable again.
  for (int i = 0; i < 4; ++i) {
    std::vector<std::pair<int32_t, DraftRow>> rows;
    rows.emplace_back(1, row());
    EXPECT_TRUE(pool.Store(DraftPoolKey("s", std::to_string(i)), std::move(rows)).ok());
  }
}

}  // namespace
}  // namespace samplerd
