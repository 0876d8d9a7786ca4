#include "sampler/row_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sampler/reference_sampler.h"
#include "sampler/row_kernels.h"
#include "sampler/spec_rules.h"
#include "sampler/test_util.h"

namespace samplerd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

NormalizedParams Params(float temperature = 1.0f, float top_p = 1.0f, int32_t top_k = -1,
                        float min_p = 0.0f) {
  NormalizedParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.min_p = min_p;
  return p;
}

TEST(RowProcessor, TopPThenTopKWorkedExample) {
  // SPEC 3: probabilities [0.50, 0.25, 0.15, 0.06, 0.04], top_p = 0.8, top_k = 2.
  HostLogits logits(1, 5);
  const double probs[5] = {0.50, 0.25, 0.15, 0.06, 0.04};
  for (int t = 0; t < 5; ++t) logits.values[t] = static_cast<float>(std::log(probs[t]));
  const NormalizedParams params = Params(1.0f, 0.8f, 2);
  RowOptions options;
  options.params = &params;
  options.vocab_size = 5;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  EXPECT_NEAR(std::exp(proc.Logprob(0)), 2.0 / 3.0, 1e-6);
  EXPECT_NEAR(std::exp(proc.Logprob(1)), 1.0 / 3.0, 1e-6);
  for (int t = 2; t < 5; ++t) EXPECT_EQ(proc.Logprob(t), kNegInf) << t;
  EXPECT_EQ(proc.NumKept(), 2);
}

TEST(RowProcessor, TopPAloneKeepsShortestPrefixAboveThreshold) {
  HostLogits logits(1, 5);
  const double probs[5] = {0.50, 0.25, 0.15, 0.06, 0.04};
  for (int t = 0; t < 5; ++t) logits.values[t] = static_cast<float>(std::log(probs[t]));
  const NormalizedParams params = Params(1.0f, 0.8f);
  RowOptions options;
  options.params = &params;
  options.vocab_size = 5;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  EXPECT_EQ(proc.NumKept(), 3);  // sums before: 0, .5, .75 <= .8; .9 > .8
  EXPECT_NEAR(std::exp(proc.Logprob(2)), 0.15 / 0.90, 1e-6);
}

TEST(RowProcessor, PaddingColumnsAreNeverReadOrSampled) {
  HostLogits logits(1, 8);
  for (int t = 0; t < 8; ++t) logits.values[t] = 0.0f;
  logits.values[5] = std::nanf("");  // padding: not an error
  logits.values[6] = 100.0f;         // padding: never sampled
  logits.values[7] = std::numeric_limits<float>::infinity();
  const NormalizedParams params = Params();
  RowOptions options;
  options.params = &params;
  options.vocab_size = 5;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  for (int i = 0; i < 1000; ++i) {
    const int32_t token = proc.Draw(UniformDouble(3, i));
    ASSERT_GE(token, 0);
    ASSERT_LT(token, 5);
  }
  EXPECT_NEAR(proc.Logprob(0), std::log(0.2), 1e-6);
}

TEST(RowProcessor, NanOrPosInfInRealColumnIsAnError) {
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    HostLogits logits(2, 6, 5);
    logits.Row(1)[3] = bad;
    const NormalizedParams params = Params();
    RowOptions options;
    options.params = &params;
    options.vocab_size = 6;
    options.field = "requests[4]";
    RowProcessor proc;
    const absl::Status status = proc.Process(logits.View(), 1, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(status.message()).find("requests[4]: logits row 1"), std::string::npos)
        << status;
  }
}

TEST(RowProcessor, FullyMaskedRowHasNoTokenLeft) {
  HostLogits logits(1, 40, 5);
  const NormalizedParams params = Params();
  const std::string mask = MaskOf(40, {});
  RowOptions options;
  options.params = &params;
  options.vocab_size = 40;
  options.mask = reinterpret_cast<const unsigned char*>(mask.data());
  RowProcessor proc;
  const absl::Status status = proc.Process(logits.View(), 0, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("no token left"), std::string::npos);
}

TEST(RowProcessor, ExactTiesRankByLowerIdFirst) {
  // Four equal logits, top_k = 2: tokens 1 and 2 (the lower ids among the tied) survive.
  HostLogits logits(1, 6);
  const float row[6] = {-1.0f, 2.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  std::copy(row, row + 6, logits.values.begin());
  const NormalizedParams params = Params(1.0f, 1.0f, 2);
  RowOptions options;
  options.params = &params;
  options.vocab_size = 6;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  EXPECT_TRUE(proc.Kept(1));
  EXPECT_TRUE(proc.Kept(2));
  EXPECT_FALSE(proc.Kept(3));
  EXPECT_FALSE(proc.Kept(4));
  TopLogprobs top;
  proc.Top(3, &top);
  EXPECT_EQ(top.token_ids, (std::vector<int32_t>{1, 2, -1}));
  EXPECT_EQ(top.logprobs[2], kNegInf);
  // Inverse CDF in order 1, 2: u < 0.5 draws 1.
  EXPECT_EQ(proc.Draw(0.49), 1);
  EXPECT_EQ(proc.Draw(0.51), 2);
  // sum_smaller of 2: p(1) == p(2) and 1 <= 2, so both count: 1.0; of 1: only itself.
  EXPECT_FLOAT_EQ(proc.SumSmallerProbs(2), 1.0f);
  EXPECT_FLOAT_EQ(proc.SumSmallerProbs(1), 0.5f);
}

// -0.0 and +0.0 are equal values: they tie and rank by id, on every route to the kept set
// (top-p alone goes through the score histogram, top-k through the selection), and so do the
// scores of a temperature of +inf (every finite x / inf is +-0).
// SPEC 5 orders tokens by probability, and two different scores can have the same float32
// weight exp(s - max): the exact probabilities still differ, so the higher score comes first
// (its interval is the earlier one), whatever the ids. Issue 34's production-shape DRAFT draw
// differed from the GPU's (which orders by score) by one token's probability, 5e-6, because the
// full-vocabulary draw ordered equal weights by id.
TEST(RowProcessor, EqualWeightsOfDifferentScoresDrawInScoreOrder) {
  // Token 1 scores s1, token 2 a little higher with the same weight; token 0 is the max (0).
  const float s1 = -1.0f;
  float w[2];
  ExpShiftAndSum(&s1, 1, 0.0f, &w[0]);
  float s2 = s1;
  do {
    s2 = std::nextafter(s2, 0.0f);
    ExpShiftAndSum(&s2, 1, 0.0f, &w[1]);
  } while (w[1] != w[0] && s2 < -0.9f);
  ASSERT_EQ(w[1], w[0]) << "no score above -1 shares its weight";
  ASSERT_GT(s2, s1);
  HostLogits logits(1, 3);
  logits.values = {0.0f, s1, s2};
  const NormalizedParams params = Params();
  RowOptions options;
  options.params = &params;
  options.vocab_size = 3;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  // Exact order 0, 2, 1: u in the middle of token 2's interval [1, 1 + w) of 1 + 2w.
  const double weight = w[0];
  EXPECT_EQ(proc.Draw((1.0 + 0.5 * weight) / (1.0 + 2.0 * weight)), 2);
  EXPECT_EQ(proc.Draw((1.0 + 1.5 * weight) / (1.0 + 2.0 * weight)), 1);
}

// The production shape of issue 34's miss: V = 129,280, no top-p or top-k (the draw goes by
// buckets over the whole vocabulary). Such a row holds dozens of neighbours in the exact order
// whose float32 weights are equal; u at the middle of each one's exact interval (and of 300
// others) must draw that token, as SPEC 5 and the float64 reference have it.
TEST(RowProcessor, WideRowDrawsEveryIntervalsTokenInTheExactOrder) {
  const int32_t vocab = 129280;
  std::mt19937_64 rng(34);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> raw(vocab);
  for (float& v : raw) v = normal(rng);
  const NormalizedParams params = Params();
  ReferenceOptions ref_options;
  ref_options.vocab_size = vocab;
  const ReferenceRow ref = ReferenceProcess(raw, params, ref_options);
  ASSERT_TRUE(ref.ok);
  HostLogits logits(1, vocab);
  logits.values = raw;
  RowOptions options;
  options.params = &params;
  options.vocab_size = vocab;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  double sum = 0.0;
  for (int32_t t : ref.order) sum += ref.probs[t];
  std::vector<double> before(ref.order.size());  // exact mass before each position
  double cumulative = 0.0;
  for (size_t r = 0; r < ref.order.size(); ++r) {
    before[r] = cumulative;
    cumulative += ref.probs[ref.order[r]];
  }
  std::vector<size_t> positions;
  int tied_pairs = 0;
  for (size_t r = 0; r + 1 < ref.order.size(); ++r) {
    if (proc.Probability(ref.order[r]) == proc.Probability(ref.order[r + 1]) &&
        raw[ref.order[r]] != raw[ref.order[r + 1]]) {
      positions.push_back(r);
      positions.push_back(r + 1);
      ++tied_pairs;
    }
  }
  ASSERT_GE(tied_pairs, 5) << "the row holds too few equal weights to test their order";
  for (int k = 0; k < 300; ++k) positions.push_back(rng() % ref.order.size());
  for (size_t r : positions) {
    const int32_t token = ref.order[r];
    const double u = (before[r] + 0.5 * ref.probs[token]) / sum;
    ASSERT_EQ(proc.Draw(u), token) << "position " << r << " of " << ref.order.size();
  }
  std::printf("%d neighbours with equal float32 weights, %zu intervals drawn\n", tied_pairs,
              positions.size());
}

TEST(RowProcessor, SignedZerosTieAndRankByLowerId) {
  struct Case {
    const char* what;
    std::vector<float> row;
    float temperature, top_p;
    int32_t top_k;
    std::vector<int32_t> kept;
  };
  const std::vector<Case> cases = {
      // Two equal scores, p = 0.5 each; top_p = 0.3 keeps the first in (score desc, id asc).
      {"top-p, -0 before +0", {-0.0f, 0.0f, kNegInf, kNegInf}, 1.0f, 0.3f, -1, {0}},
      {"top-p, +0 before -0", {0.0f, -0.0f, kNegInf, kNegInf}, 1.0f, 0.3f, -1, {0}},
      {"top-k", {-0.0f, -0.0f, 0.0f, 0.0f}, 1.0f, 1.0f, 2, {0, 1}},
      // T = +inf: every score is +-0, the distribution uniform; the first tokens by id.
      {"T = inf, top-p", {-3.0f, 2.0f, -1.0f, 5.0f}, INFINITY, 0.4f, -1, {0, 1}},
      {"T = inf, top-k", {-3.0f, 2.0f, -1.0f, 5.0f}, INFINITY, 1.0f, 3, {0, 1, 2}},
      {"T = inf, a -inf logit", {-3.0f, kNegInf, -1.0f, 5.0f, 1.0f}, INFINITY, 0.5f, -1, {0, 2, 3}},
  };
  for (const Case& c : cases) {
    const int32_t V = static_cast<int32_t>(c.row.size());
    HostLogits logits(1, V);
    std::copy(c.row.begin(), c.row.end(), logits.values.begin());
    const NormalizedParams params = Params(c.temperature, c.top_p, c.top_k);
    RowOptions options;
    options.params = &params;
    options.vocab_size = V;
    RowProcessor proc;
    ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok()) << c.what;
    std::vector<int32_t> kept;
    for (int32_t t = 0; t < V; ++t) {
      if (proc.Kept(t)) kept.push_back(t);
    }
    EXPECT_EQ(kept, c.kept) << c.what;
    // The float64 reference agrees.
    ReferenceOptions ref_options;
    ref_options.vocab_size = V;
    const ReferenceRow ref = ReferenceProcess(c.row, params, ref_options);
    ASSERT_TRUE(ref.ok) << c.what;
    for (int32_t t = 0; t < V; ++t) {
      EXPECT_EQ(ref.probs[t] > 0.0, proc.Kept(t)) << c.what << " token " << t;
    }
  }
}

// SPEC 3: a finite value that a penalty or the temperature pushes out of float32 (either
// sign) is an error of the request, never a NaN or -inf answer; -inf from the mask, or huge
// values that stay in range, are not.
TEST(RowProcessor, ValueLeavingFloat32IsAnError) {
  struct Case {
    const char* what;
    float value;         // token 1's logit
    float temperature;
    float repetition;    // applied to token 1 (a prompt token)
    bool masked;         // token 1 masked out
    bool error;
  };
  const Case cases[] = {
      {"repetition 1e-38 on a positive logit", 10.0f, 1.0f, 1e-38f, false, true},
      {"repetition 1e38 on a negative logit", -10.0f, 1.0f, 1e38f, false, true},
      {"1e34 at temperature 1e-5", 1e34f, kSamplingEps, 1.0f, false, true},
      {"3e38 at temperature 0.5", 3e38f, 0.5f, 1.0f, false, true},
      {"-3e38 at temperature 0.5", -3e38f, 0.5f, 1.0f, false, true},
      {"1.7e38 at temperature 0.5 stays finite", 1.7e38f, 0.5f, 1.0f, false, false},
      {"3e38 masked out", 3e38f, 0.5f, 1.0f, true, false},
      {"3e38 at temperature 1", 3e38f, 1.0f, 1.0f, false, false},
  };
  for (const Case& c : cases) {
    HostLogits logits(1, 4);
    const float row[4] = {0.5f, c.value, -1.0f, 2.0f};
    std::copy(row, row + 4, logits.values.begin());
    NormalizedParams params = Params(c.temperature);
    params.repetition_penalty = c.repetition;
    const std::vector<int32_t> prompt = {1};
    const std::string mask = MaskOf(4, {0, 2, 3});
    RowOptions options;
    options.params = &params;
    options.vocab_size = 4;
    const std::vector<TokenUpdate> updates =
        RowTokenUpdates({}, params.Penalties(), prompt, {}, {});
    options.updates = updates;
    options.field = "requests[0]";
    if (c.masked) options.mask = reinterpret_cast<const unsigned char*>(mask.data());
    RowProcessor proc;
    const absl::Status status = proc.Process(logits.View(), 0, options);
    if (c.error) {
      EXPECT_EQ(status, ValueOverflowError("requests[0]", 0)) << c.what;
    } else {
      ASSERT_TRUE(status.ok()) << c.what << ": " << status;
      for (int t = 0; t < 4; ++t) EXPECT_FALSE(std::isnan(proc.Logprob(t))) << c.what;
    }
  }
}

TEST(RowProcessor, RepetitionThenPresenceAndFrequency) {
  HostLogits logits(1, 4);
  const float row[4] = {2.0f, -2.0f, 1.0f, 0.5f};
  std::copy(row, row + 4, logits.values.begin());
  NormalizedParams params = Params();
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  const std::vector<int32_t> prompt = {0, 1};
  const std::vector<int32_t> output = {2, 2, 1};
  RowOptions options;
  options.params = &params;
  options.vocab_size = 4;
  const std::vector<TokenUpdate> updates =
      RowTokenUpdates({}, params.Penalties(), prompt, output, {});
  options.updates = updates;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  // 0: 2/2 = 1. 1: -2*2 = -4, then -0.5 - 0.25 = -4.75. 2: 1/2 = 0.5, -0.5 - 0.5 = -0.5.
  // 3: untouched 0.5.
  const double x[4] = {1.0, -4.75, -0.5, 0.5};
  double z = 0;
  for (double v : x) z += std::exp(v);
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(proc.Logprob(t), x[t] - std::log(z), 1e-6) << t;
}

TEST(RowProcessor, ForceTopNKeepsNLargestAndMinPCuts) {
  HostLogits logits(1, 6);
  const float row[6] = {0.0f, 3.0f, 1.0f, 3.0f, -1.0f, 2.0f};
  std::copy(row, row + 6, logits.values.begin());
  NormalizedParams params = Params();
  RowOptions options;
  options.params = &params;
  options.vocab_size = 6;
  options.force_top_n = 3;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  EXPECT_EQ(proc.ForceTopNIds(), (std::vector<int32_t>{1, 3, 5}));
  EXPECT_EQ(proc.NumKept(), 3);
  params.min_p = 0.5f;  // exp(2 - 3) = 0.37 < 0.5: token 5 goes
  ASSERT_TRUE(proc.Process(logits.View(), 0, options).ok());
  EXPECT_EQ(proc.NumKept(), 2);
  EXPECT_NEAR(proc.Logprob(1), std::log(0.5), 1e-6);
}

// The pipeline against the independent float64 reference on random rows.
struct RandomCase {
  int32_t vocab;
  NormalizedParams params;
  int32_t force_top_n = 0;
  bool mask = false;
  bool penalties = false;
  bool ties = false;
  // A fifth of the values exotic: +-0, -inf, or magnitudes near 1e29; the rest negative, so
  // that signed zeros lead the row (ties across a top-p cut). (Not subnormals, nor a
  // T so huge that scores are: distinct scores there share a float64 probability, so the
  // reference's ties by probability and the backends' ties by score part ways.)
  bool exotic = false;
  DType dtype = DType::kFloat32;
  bool prompt_mode = false;
};

void CheckAgainstReference(const RandomCase& c, uint64_t seed, int* compared) {
  std::mt19937_64 rng(seed);
  const int32_t pad = 3;
  const int32_t cols = c.vocab + pad;
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> raw(cols);
  for (float& v : raw) v = normal(rng);
  if (c.ties) {
    for (float& v : raw) v = std::round(v * 2.0f) / 2.0f;  // many exact ties
  }
  if (c.exotic) {
    std::uniform_int_distribution<int> kind(0, 19);
    for (float& v : raw) {
      switch (kind(rng)) {
        case 0: v = 0.0f; break;
        case 1: v = -0.0f; break;
        case 2: v = kNegInf; break;
        case 3: v *= 1e29f; break;
        default: v = -std::fabs(v) - 0.25f; break;  // below the zeros, which then lead
      }
    }
    raw[0] = 0.0f;  // a finite token, whatever else the row holds
  }
  for (int32_t t = c.vocab; t < cols; ++t) raw[t] = std::nanf("");  // padding NaN is fine
  // Storage in the case's dtype; the reference sees the same (exactly converted) values.
  std::vector<uint16_t> half(cols);
  LogitsView view;
  view.rows = 1;
  view.cols = cols;
  view.row_stride = cols;
  view.dtype = c.dtype;
  if (c.dtype == DType::kFloat32) {
    view.data = raw.data();
  } else {
    for (int32_t t = 0; t < cols; ++t) {
      half[t] = c.dtype == DType::kBFloat16 ? FloatToBFloat16(raw[t]) : FloatToHalf(raw[t]);
      raw[t] = c.dtype == DType::kBFloat16 ? BFloat16ToFloat(half[t]) : HalfToFloat(half[t]);
    }
    view.data = half.data();
  }
  std::string mask;
  std::vector<int32_t> prompt, output;
  ReferenceOptions ref_options;
  ref_options.vocab_size = c.vocab;
  ref_options.force_top_n = c.force_top_n;
  ref_options.prompt_mode = c.prompt_mode;
  if (c.mask) {
    std::vector<int32_t> allowed;
    std::bernoulli_distribution keep(0.6);
    for (int32_t t = 0; t < c.vocab; ++t) {
      if (keep(rng)) allowed.push_back(t);
    }
    if (allowed.empty()) allowed.push_back(0);
    mask = MaskOf(c.vocab, allowed);
    ref_options.mask = reinterpret_cast<const unsigned char*>(mask.data());
  }
  if (c.penalties) {
    std::uniform_int_distribution<int32_t> token(0, c.vocab - 1);
    for (int i = 0; i < 20; ++i) prompt.push_back(token(rng));
    for (int i = 0; i < 30; ++i) output.push_back(token(rng) % std::max(1, c.vocab / 4));
    ref_options.prompt_tokens = prompt;
    ref_options.output_tokens = output;
  }
  const ReferenceRow ref = ReferenceProcess(raw, c.params, ref_options);
  ASSERT_TRUE(ref.ok);
  if (ref.top_p_margin < 1e-6) return;  // the cut itself is within rounding: either is right

  RowOptions options;
  options.params = &c.params;
  options.vocab_size = c.vocab;
  options.force_top_n = c.force_top_n;
  options.mask = ref_options.mask;
  const std::vector<TokenUpdate> updates =
      RowTokenUpdates({}, c.params.Penalties(), prompt, output, {});
  options.updates = updates;
  options.prompt_mode = c.prompt_mode;
  RowProcessor proc;
  ASSERT_TRUE(proc.Process(view, 0, options).ok());
  ++*compared;

  ASSERT_EQ(proc.NumKept(), static_cast<int64_t>(ref.order.size()));
  for (int32_t t = 0; t < c.vocab; ++t) {
    const double want = ref.logprobs[t];
    const float got = proc.Logprob(t);
    if (want == -std::numeric_limits<double>::infinity()) {
      ASSERT_EQ(got, kNegInf) << "token " << t;
    } else if (want >= -20.0) {
      ASSERT_NEAR(got, want, 1e-5) << "token " << t;
    }
  }
  const int32_t n = 7;
  TopLogprobs top;
  proc.Top(n, &top);
  const auto ref_top = ReferenceTop(ref, n);
  for (int32_t i = 0; i < n; ++i) {
    ASSERT_EQ(top.token_ids[i], ref_top[i].first) << "rank " << i;
    if (ref_top[i].first >= 0 && ref_top[i].second >= -20.0) {
      ASSERT_NEAR(top.logprobs[i], ref_top[i].second, 1e-5);
    }
  }
  for (uint64_t k = 0; k < 50; ++k) {
    const double u = UniformDouble(seed, k);
    double edge = 0;
    const int32_t want = ReferenceDraw(ref, u, &edge);
    const int32_t got = proc.Draw(u);
    if (edge >= 1e-6) ASSERT_EQ(got, want) << "u = " << u;
    ASSERT_NEAR(proc.SumSmallerProbs(got), ReferenceSumSmaller(ref, got), 1e-5);
  }
}

TEST(RowProcessor, MatchesFloat64ReferenceOnRandomRows) {
  std::vector<RandomCase> cases;
  for (int32_t vocab : {5, 37, 1000, 50000}) {
    cases.push_back({vocab, Params()});
    cases.push_back({vocab, Params(0.7f, 0.95f, 50)});
    cases.push_back({vocab, Params(1.3f, 0.9f)});
    cases.push_back({vocab, Params(0.5f, 1.0f, 3)});
    cases.push_back({vocab, Params(1.0f, 1.0f, -1, 0.05f)});
    cases.push_back({vocab, Params(kSamplingEps)});
    RandomCase masked{vocab, Params(0.8f, 0.9f, 20, 0.01f)};
    masked.mask = true;
    masked.penalties = true;
    masked.params.repetition_penalty = 1.3f;
    masked.params.presence_penalty = 0.4f;
    masked.params.frequency_penalty = -0.2f;
    cases.push_back(masked);
    RandomCase topn{vocab, Params(0.9f, 0.95f)};
    topn.force_top_n = std::max(2, vocab / 5);
    cases.push_back(topn);
    RandomCase ties{vocab, Params(1.0f, 0.9f, 10)};
    ties.ties = true;
    cases.push_back(ties);
    RandomCase ties_full{vocab, Params()};
    ties_full.ties = true;
    cases.push_back(ties_full);
    RandomCase bf16{vocab, Params(0.7f, 0.95f, 50)};
    bf16.dtype = DType::kBFloat16;
    cases.push_back(bf16);
    RandomCase fp16{vocab, Params(1.0f, 0.8f)};
    fp16.dtype = DType::kFloat16;
    cases.push_back(fp16);
    RandomCase prompt{vocab, Params(0.7f, 0.9f, 5, 0.5f)};
    prompt.prompt_mode = true;
    prompt.mask = true;  // ignored in prompt mode, by both
    cases.push_back(prompt);
    const float inf = std::numeric_limits<float>::infinity();
    for (const NormalizedParams& params :
         {Params(1.0f, 0.9f), Params(1.0f, 0.1f), Params(0.6f, 1.0f, 7), Params(inf, 0.9f),
          Params(inf, 0.03f), Params(inf, 1.0f, 7), Params(2.0f, 1.0f, -1, 0.05f)}) {
      RandomCase exotic{vocab, params};
      exotic.exotic = true;
      cases.push_back(exotic);
    }
  }
  int compared = 0;
  int total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      SCOPED_TRACE(testing::Message() << "case " << i << " vocab " << cases[i].vocab
                                      << " seed " << seed);
      ++total;
      CheckAgainstReference(cases[i], 1000 * i + seed, &compared);
      if (HasFatalFailure()) return;
    }
  }
  // Rows skipped for a top-p cut within 1e-6 of a cumulative sum must stay rare.
  EXPECT_GE(compared, total * 9 / 10);
}

}  // namespace
}  // namespace samplerd
