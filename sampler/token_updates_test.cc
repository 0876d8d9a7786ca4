#include "sampler/token_updates.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

namespace samplerd {
namespace {

// {token, flags, bias, count, late_bias}
TokenUpdate Entry(int32_t token, int32_t flags, float bias = 0, float late_bias = 0,
                  int32_t count = 0) {
  return TokenUpdate{token, flags, bias, count, late_bias};
}

TEST(MergeTokenUpdates, ComposesPerTokenSortedByToken) {
  const std::vector<TokenUpdate> merged = MergeTokenUpdates({
      Entry(9, kUpdateBias, 1.5f),
      Entry(2, kUpdatePenalize, 0, 0, 1),
      Entry(9, kUpdateLateBias, 0, -0.25f),
      Entry(2, kUpdatePenalize, 0, 0, 2),
      Entry(9, kUpdateBias, 0.25f),
      Entry(9, kUpdateLateBias, 0, -1.0f),
      Entry(5, kUpdateBias, 3.0f),
      Entry(5, kUpdateBan),
  });
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].token, 2);
  EXPECT_EQ(merged[0].flags, kUpdatePenalize);
  EXPECT_EQ(merged[0].count, 3);  // counts add
  EXPECT_EQ(merged[1].token, 5);
  EXPECT_EQ(merged[1].flags, kUpdateBan | kUpdateBias);  // the ban stays: UpdateToken gives -inf
  EXPECT_EQ(merged[2].token, 9);
  EXPECT_EQ(merged[2].flags, kUpdateBias | kUpdateLateBias);
  EXPECT_EQ(merged[2].bias, 1.75f);        // biases add
  EXPECT_EQ(merged[2].late_bias, -1.25f);  // late biases add, apart from the biases
  bool left = false;
  EXPECT_EQ(UpdateToken(4.0f, merged[1], PenaltySettings{}, &left),
            -std::numeric_limits<float>::infinity());
  EXPECT_EQ(UpdateToken(4.0f, merged[2], PenaltySettings{}, &left), 4.5f);
}

TEST(MergeTokenUpdates, ALoneBiasIsKeptAsSent) {
  // A -0.0 bias merged with a penalty entry stays -0.0 (not 0.0 + -0.0 = +0.0): the merge
  // never changes the arithmetic of a token with one bias.
  const std::vector<TokenUpdate> merged =
      MergeTokenUpdates({Entry(1, kUpdatePenalize, 0, 0, 1), Entry(1, kUpdateBias, -0.0f)});
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_TRUE(std::signbit(merged[0].bias));
}

TEST(RowTokenUpdates, EverySourceMergesIntoOneEntryPerToken) {
  TokenAdjustments adjustments;
  adjustments.bad_words = {{4, 7}, {3}};
  adjustments.min_tokens = 5;
  adjustments.stop_token_ids = {3, 8};
  adjustments.logit_bias = {{3, 2.0f}, {6, -1.0f}};
  const PenaltySettings penalties{1.1f, 0.0f, 0.0f};
  const std::vector<int32_t> prompt = {6, 6};
  const std::vector<int32_t> output = {1, 4};
  const std::vector<int32_t> drafts = {6};
  const std::vector<TokenUpdate> u =
      RowTokenUpdates(adjustments, penalties, prompt, output, drafts);
  // Tokens: 1 (output), 3 (bad word, stop id, bias), 4 (output), 6 (prompt, draft, bias),
  // 8 (stop id). 7 is not banned: the history ends with 6, not 4.
  ASSERT_EQ(u.size(), 5u);
  EXPECT_EQ(u[0].token, 1);
  EXPECT_EQ(u[0].flags, kUpdatePenalize);
  EXPECT_EQ(u[0].count, 1);
  EXPECT_EQ(u[1].token, 3);
  EXPECT_EQ(u[1].flags, kUpdateBan | kUpdateBias);
  EXPECT_EQ(u[2].token, 4);
  EXPECT_EQ(u[3].token, 6);
  EXPECT_EQ(u[3].flags, kUpdateBias | kUpdatePenalize);
  EXPECT_EQ(u[3].bias, -1.0f);
  EXPECT_EQ(u[3].count, 1);  // the draft; prompt tokens count for repetition only
  EXPECT_EQ(u[4].token, 8);
  EXPECT_EQ(u[4].flags, kUpdateBan);
}

// DRY (SPEC 3 step 3). The entries of a context, as (token, late_bias) pairs sorted by token.
std::vector<std::pair<int32_t, float>> Dry(const DryPenalty& dry, std::vector<int32_t> prompt,
                                           std::vector<int32_t> output = {},
                                           std::vector<int32_t> drafts = {}) {
  std::vector<TokenUpdate> u = MergeTokenUpdates(DryUpdates(dry, prompt, output, drafts));
  std::vector<std::pair<int32_t, float>> out;
  for (const TokenUpdate& e : u) {
    EXPECT_EQ(e.flags, kUpdateLateBias);
    out.emplace_back(e.token, e.late_bias);
  }
  return out;
}

DryPenalty SpecDry() {  // SPEC's worked example: no breakers, allowed length 2, multiplier 1, base 2
  DryPenalty dry;
  dry.multiplier = 1.0f;
  dry.base = 2.0f;
  dry.allowed_length = 2;
  return dry;
}

using Entries = std::vector<std::pair<int32_t, float>>;

TEST(DryUpdates, SpecWorkedExample) {
  // c = [5, 6, 7, 9, 5, 6, 7]: i = 2 matches back 7, 6, 5 (m = 3), next token 9: x[9] -= 2^1.
  EXPECT_EQ(Dry(SpecDry(), {5, 6, 7, 9, 5, 6, 7}), (Entries{{9, -2.0f}}));
  // Off, or a context too short: nothing.
  DryPenalty off = SpecDry();
  off.multiplier = 0.0f;
  EXPECT_TRUE(Dry(off, {5, 6, 7, 9, 5, 6, 7}).empty());
  EXPECT_TRUE(Dry(SpecDry(), {7}).empty());
  // A repeat shorter than allowed_length is free: raise it to 4 and the m = 3 match is.
  DryPenalty longer = SpecDry();
  longer.allowed_length = 4;
  EXPECT_TRUE(Dry(longer, {5, 6, 7, 9, 5, 6, 7}).empty());
  longer.allowed_length = 3;
  EXPECT_EQ(Dry(longer, {5, 6, 7, 9, 5, 6, 7}), (Entries{{9, -1.0f}}));  // 2^0
}

TEST(DryUpdates, SequenceBreakersCutMatches) {
  DryPenalty dry = SpecDry();
  dry.breakers = {6};  // the match 7, 6, 5 stops before 6: m = 1 < 2
  EXPECT_TRUE(Dry(dry, {5, 6, 7, 9, 5, 6, 7}).empty());
  dry.breakers = {7};  // the last token is a breaker: nothing at all
  EXPECT_TRUE(Dry(dry, {5, 6, 7, 9, 5, 6, 7}).empty());
  dry.breakers = {9};  // the token after the match is a breaker: that match does not count
  EXPECT_TRUE(Dry(dry, {5, 6, 7, 9, 5, 6, 7}).empty());
  dry.breakers = {5};  // the match stops before 5: m = 2, which still counts (2^0)
  EXPECT_EQ(Dry(dry, {5, 6, 7, 9, 5, 6, 7}), (Entries{{9, -1.0f}}));
}

TEST(DryUpdates, RangeCutsTheContextAcrossItsParts) {
  // The last 6 of prompt [5, 6] + output [7, 9, 5] + drafts [6, 7]: c = [6, 7, 9, 5, 6, 7],
  // i = 1 matches 7, 6 (m = 2; i - m < 0 ends it): x[9] -= 2^0.
  DryPenalty dry = SpecDry();
  dry.range = 6;
  EXPECT_EQ(Dry(dry, {5, 6}, {7, 9, 5}, {6, 7}), (Entries{{9, -1.0f}}));
  dry.range = 4;  // c = [9, 5, 6, 7]: no earlier 7
  EXPECT_TRUE(Dry(dry, {5, 6}, {7, 9, 5}, {6, 7}).empty());
  dry.range = 0;  // the whole context: the worked example again
  EXPECT_EQ(Dry(dry, {5, 6}, {7, 9, 5}, {6, 7}), (Entries{{9, -2.0f}}));
}

TEST(DryUpdates, DraftsBeforeTheRowExtendTheRepeat) {
  // A DECODE row whose earlier drafts complete the repeat: with the draft 7 the context ends
  // 5, 6, 7 (x[9] -= 2); without it, it ends 5, 6 and i = 1 matches 6, 5 (next token 7).
  EXPECT_EQ(Dry(SpecDry(), {5, 6, 7, 9, 5}, {6}, {7}), (Entries{{9, -2.0f}}));
  EXPECT_EQ(Dry(SpecDry(), {5, 6, 7, 9, 5}, {6}, {}), (Entries{{7, -1.0f}}));
}

TEST(DryUpdates, MatchesStopAtFifty) {
  // c = s + s with |s| = 60: the last token matches at i = 59 back to the start (60 long),
  // counted as 50; the next token is s[0].
  std::vector<int32_t> c;
  for (int r = 0; r < 2; ++r) {
    for (int32_t t = 0; t < 60; ++t) c.push_back(100 + t);
  }
  DryPenalty dry;
  dry.multiplier = 0.8f;
  dry.base = 1.75f;
  dry.allowed_length = 2;
  const float want = static_cast<float>(0.8f * std::pow(static_cast<double>(1.75f), 48.0));
  EXPECT_EQ(Dry(dry, c), (Entries{{100, -want}}));
  // Matches followed by different tokens: each its own (c ends 1, 2, 3: i = 2 matches 3, 2, 1
  // and is followed by 2; i = 4 matches 3, 2 and is followed by 9).
  EXPECT_EQ(Dry(SpecDry(), {1, 2, 3, 2, 3, 9, 1, 2, 3}), (Entries{{2, -2.0f}, {9, -1.0f}}));
  // Two matches followed by the same token: the longer counts (M[t] = max m: 7, not 2).
  EXPECT_EQ(Dry(SpecDry(), {2, 3, 9, 5, 1, 2, 3, 9, 5, 1, 2, 3}), (Entries{{9, -32.0f}}));
}

TEST(DryUpdates, ComposeWithTheOtherAdjustments) {
  TokenAdjustments adjustments;
  adjustments.logit_bias = {{9, 1.5f}};
  adjustments.dry = SpecDry();
  const std::vector<int32_t> prompt = {5, 6, 7, 9, 5, 6};
  const std::vector<int32_t> output = {7};
  const std::vector<TokenUpdate> u =
      RowTokenUpdates(adjustments, PenaltySettings{1.0f, 0.5f, 0.0f}, prompt, output, {});
  const auto nine = std::find_if(u.begin(), u.end(), [](const TokenUpdate& e) { return e.token == 9; });
  ASSERT_NE(nine, u.end());
  EXPECT_EQ(nine->flags, kUpdateBias | kUpdatePenalize | kUpdateLateBias);
  // 3.0 + bias 1.5, then the penalties (9 is in the prompt, not the output: no presence
  // penalty), then DRY's -2 after them.
  bool left = false;
  EXPECT_EQ(UpdateToken(3.0f, *nine, PenaltySettings{1.0f, 0.5f, 0.0f}, &left), 2.5f);
  EXPECT_FALSE(left);
  // A late bias that carries a finite value out of float32 is flagged (its request fails). DRY's
  // own largest penalty, 100 x 4^48 ~ 7.9e30, is below half an ulp of FLT_MAX, so it cannot do
  // that alone; the check is the seam's, for any late bias.
  TokenUpdate huge = *nine;
  huge.flags = kUpdateLateBias;
  huge.late_bias = -3.0e38f;
  EXPECT_EQ(UpdateToken(-3.0e38f, huge, PenaltySettings{}, &left),
            -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(left);
}

// SPEC 3 step 3 read literally (a copied context, every i, a map of M[t]), against DryUpdates'
// no-copy, block-scanning version, on random contexts split at random into prompt, output and
// drafts, with random breakers, ranges and a small alphabet (so matches are many and long).
// Contexts up to 700 tokens, so pieces hold whole 64-token scan blocks and partial ones, and
// matches cross from one piece into the one before.
TEST(DryUpdates, AgreesWithSpecReadLiterallyOnRandomContexts) {
  std::mt19937_64 rng(33);
  for (int trial = 0; trial < 1000; ++trial) {
    const int32_t alphabet = 2 + static_cast<int32_t>(rng() % 6);
    const size_t total = rng() % 700;
    std::vector<int32_t> c(total);
    for (int32_t& t : c) t = static_cast<int32_t>(rng() % alphabet);
    if (trial % 3 == 0) {  // a long exact repeat, past the 50 cap
      for (size_t k = 0; k < total; ++k) c[k] = static_cast<int32_t>(k % 61) + 10;
    }
    const size_t a = total ? rng() % (total + 1) : 0, b = a + (total - a ? rng() % (total - a + 1) : 0);
    DryPenalty dry;
    dry.multiplier = 0.8f;
    dry.base = 1.75f;
    dry.allowed_length = 1 + static_cast<int32_t>(rng() % 3);
    if (rng() % 2) dry.breakers = {static_cast<int32_t>(rng() % alphabet)};
    if (rng() % 4 == 0) {
      dry.breakers = {static_cast<int32_t>(rng() % 3), 3 + static_cast<int32_t>(rng() % 60)};
    }
    dry.range = rng() % 2 ? 0 : static_cast<int32_t>(rng() % 400);
    // The literal reading.
    std::vector<int32_t> ctx = c;
    if (dry.range > 0 && ctx.size() > static_cast<size_t>(dry.range)) {
      ctx.erase(ctx.begin(), ctx.end() - dry.range);
    }
    auto is_breaker = [&](int32_t t) {
      return std::find(dry.breakers.begin(), dry.breakers.end(), t) != dry.breakers.end();
    };
    std::map<int32_t, int32_t> longest;
    const int64_t n = static_cast<int64_t>(ctx.size());
    if (n >= 2 && !is_breaker(ctx[n - 1])) {
      for (int64_t i = 0; i <= n - 2; ++i) {
        if (ctx[i] != ctx[n - 1] || is_breaker(ctx[i + 1])) continue;
        int32_t m = 1;
        while (m < 50 && i - m >= 0 && ctx[i - m] == ctx[n - 1 - m] && !is_breaker(ctx[n - 1 - m])) ++m;
        longest[ctx[i + 1]] = std::max(longest[ctx[i + 1]], m);
      }
    }
    Entries want;
    for (const auto& [t, m] : longest) {
      if (m < dry.allowed_length) continue;
      want.emplace_back(t, -static_cast<float>(0.8f * std::pow(static_cast<double>(1.75f),
                                                                  m - dry.allowed_length)));
    }
    const std::vector<int32_t> prompt(c.begin(), c.begin() + a), output(c.begin() + a, c.begin() + b),
        drafts(c.begin() + b, c.end());
    ASSERT_EQ(Dry(dry, prompt, output, drafts), want) << "trial " << trial;
  }
}

// Issue 45: a request's history is merged once and shared by its rows. A row's list from the
// shared history is, field for field, the one list of every source in SPEC's order merged at
// once (the pre-issue-45 way), on random requests with every source.
TEST(RowTokenUpdates, SharedHistoryGivesTheSameListAsOneMerge) {
  std::mt19937 rng(45);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t vocab = 4 + static_cast<int32_t>(rng() % 60);
    auto tokens = [&](size_t n) {
      std::vector<int32_t> out(n);
      for (int32_t& t : out) t = static_cast<int32_t>(rng() % vocab);
      return out;
    };
    const std::vector<int32_t> prompt = tokens(rng() % 80), output = tokens(rng() % 40),
                               drafts = tokens(rng() % 6);
    TokenAdjustments adjustments;
    if (rng() % 2) adjustments.bad_words = {tokens(1), tokens(2)};
    if (rng() % 2) {
      adjustments.min_tokens = static_cast<int32_t>(rng() % 60);
      adjustments.stop_token_ids = {0, 3};
    }
    if (rng() % 2) adjustments.logit_bias = {{1, -0.0f}, {2, 1.5f}, {vocab - 1, -2.25f}};
    if (rng() % 2) {
      adjustments.dry.multiplier = 0.8f;
      adjustments.dry.allowed_length = 1 + static_cast<int32_t>(rng() % 3);
    }
    PenaltySettings penalties;
    if (rng() % 4 != 0) penalties = PenaltySettings{1.1f, 0.5f, 0.25f};
    // The reference: every source appended in SPEC's order, merged once.
    std::vector<TokenUpdate> all;
    for (const std::vector<int32_t>& word : adjustments.bad_words) {
      const std::vector<int32_t> history = [&] {
        std::vector<int32_t> h = output;
        h.insert(h.end(), drafts.begin(), drafts.end());
        return h;
      }();
      const size_t n = word.size() - 1;
      if (n <= history.size() &&
          std::equal(word.begin(), word.end() - 1, history.end() - static_cast<long>(n))) {
        all.push_back(Entry(word.back(), kUpdateBan));
      }
    }
    if (static_cast<int64_t>(output.size() + drafts.size()) < adjustments.min_tokens) {
      for (int32_t t : adjustments.stop_token_ids) all.push_back(Entry(t, kUpdateBan));
    }
    for (const auto& [t, bias] : adjustments.logit_bias) all.push_back(Entry(t, kUpdateBias, bias));
    if (penalties.on()) {
      for (int32_t t : prompt) all.push_back(Entry(t, kUpdatePenalize));
      for (int32_t t : output) all.push_back(Entry(t, kUpdatePenalize, 0, 0, 1));
      for (int32_t t : drafts) all.push_back(Entry(t, kUpdatePenalize, 0, 0, 1));
    }
    const std::vector<TokenUpdate> dry = DryUpdates(adjustments.dry, prompt, output, drafts);
    all.insert(all.end(), dry.begin(), dry.end());
    const std::vector<TokenUpdate> expected = MergeTokenUpdates(all);
    const std::vector<TokenUpdate> history = HistoryUpdates(prompt, output);
    const std::vector<TokenUpdate> got =
        RowTokenUpdates(adjustments, penalties, history, prompt, output, drafts);
    ASSERT_EQ(got.size(), expected.size()) << "trial " << trial;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token, expected[i].token) << trial;
      EXPECT_EQ(got[i].flags, expected[i].flags) << trial;
      EXPECT_EQ(got[i].count, expected[i].count) << trial;
      EXPECT_EQ(std::memcmp(&got[i].bias, &expected[i].bias, sizeof(float)), 0) << trial;
      EXPECT_EQ(std::memcmp(&got[i].late_bias, &expected[i].late_bias, sizeof(float)), 0)
          << trial;
    }
  }
}

}  // namespace
}  // namespace samplerd
