#include "sampler/token_updates.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

}  // namespace
}  // namespace samplerd
