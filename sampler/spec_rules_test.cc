#include "sampler/spec_rules.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace samplerd {
namespace {

TEST(UniformDouble, MatchesPinnedValues) {
  // SPEC section 4's pinned values, bit for bit.
  EXPECT_EQ(UniformDouble(1, 0), 0.5665615751722809);
  EXPECT_EQ(UniformDouble(1, 3 * 41 + 0), 0.47725830829076243);
  EXPECT_EQ(UniformDouble(12345, 3 * 20000088ULL + 2), 0.9092904846765679);
}

TEST(UniformDouble, StaysInUnitInterval) {
  for (uint64_t seq = 0; seq < 100000; ++seq) {
    const double u = UniformDouble(0xDEADBEEF, seq);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Positions, DecodeRowTwoOfWorkedExample) {
  // seqlen_k = 55, seqlen_q = 6: sample_position = 55 - 6 + 1 = 50; row 2 -> 20000088.
  EXPECT_EQ(DecodeRowPosition(50, 2), 20000088u);
  EXPECT_EQ(DecodeRowPosition(50, 0), 50u);
}

TEST(Positions, SequenceNumberIsThreePositionsPlusCase) {
  EXPECT_EQ(SequenceNumber(41, DrawCase::kFresh), 123u);
  EXPECT_EQ(SequenceNumber(20000088, DrawCase::kAcceptReject), 60000266u);
  EXPECT_EQ(SequenceNumber(7, DrawCase::kReplacement), 22u);
  // Wraps modulo 2^64 rather than failing.
  EXPECT_EQ(SequenceNumber(~0ULL, DrawCase::kFresh), ~0ULL - 2);
}

TEST(Positions, DraftPositionAddsOffsetAndIndex) {
  EXPECT_EQ(DraftPosition(50, 3, 1), 54u);
  EXPECT_EQ(DraftPosition(50, 3, 5), 58u);
  EXPECT_EQ(kDraftSeedOffset, 1000000007u);
}

// The order key orders as float comparison does: strictly increasing over distinct values
// (-inf, negatives, zeros, positives, +inf) and one key for -0.0 and +0.0, which are equal.
TEST(OrderKey, OrdersAsFloatComparisonWithSignedZerosEqual) {
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm = std::numeric_limits<float>::denorm_min();
  const std::vector<float> increasing = {-inf, -3e38f, -1.5f, -denorm, 0.0f, denorm, 1e-30f, 2.0f, 3e38f, inf};
  for (size_t i = 0; i + 1 < increasing.size(); ++i) {
    EXPECT_LT(OrderKey(increasing[i]), OrderKey(increasing[i + 1])) << increasing[i];
  }
  EXPECT_EQ(OrderKey(-0.0f), OrderKey(0.0f));
  EXPECT_LT(OrderKey(-denorm), OrderKey(-0.0f));
  EXPECT_LT(OrderKey(-0.0f), OrderKey(denorm));
}

// The per-token seam's arithmetic (SPEC 3 steps 2b-d, 3): ban, then bias, then penalties,
// then the late bias; -inf stays -inf; a finite value leaving float32 at any of them is flagged.
TEST(UpdateToken, AppliesBanBiasPenaltiesLateBiasInSpecOrder) {
  const float inf = std::numeric_limits<float>::infinity();
  const PenaltySettings repeat2{2.0f, 0.0f, 0.0f};
  // {token, flags, bias, count, late_bias}
  auto entry = [](int32_t flags, float bias, float late_bias, int32_t count = 0) {
    return TokenUpdate{0, flags, bias, count, late_bias};
  };
  bool left = false;
  // A ban wins over everything else the token carries.
  EXPECT_EQ(UpdateToken(2.0f, entry(kUpdateBan | kUpdateBias | kUpdateLateBias, 5, 5), repeat2,
                        &left), -inf);
  // The bias comes before the penalty: (2 + 1) / 2; the late bias after it: 2 / 2 - 3.
  EXPECT_EQ(UpdateToken(2.0f, entry(kUpdateBias | kUpdatePenalize, 1, 0), repeat2, &left), 1.5f);
  EXPECT_EQ(UpdateToken(2.0f, entry(kUpdatePenalize | kUpdateLateBias, 0, -3), repeat2, &left),
            -2.0f);
  // Presence and frequency count the output occurrences: 1 - (0.5 + 0.25 * 2).
  EXPECT_EQ(UpdateToken(1.0f, entry(kUpdatePenalize, 0, 0, 2), PenaltySettings{1, 0.5f, 0.25f},
                        &left), 0.0f);
  // Flags not set leave the fields unread.
  EXPECT_EQ(UpdateToken(2.0f, entry(0, 7, 7), repeat2, &left), 2.0f);
  EXPECT_FALSE(left);
  // -inf stays -inf under both biases (and the penalties keep it there).
  EXPECT_EQ(UpdateToken(-inf, entry(kUpdateBias | kUpdatePenalize | kUpdateLateBias, 9, 9),
                        repeat2, &left), -inf);
  EXPECT_FALSE(left);
  // Leaving float32 at the bias, the penalty or the late bias is flagged.
  const float big = std::numeric_limits<float>::max();
  for (const TokenUpdate& u : {entry(kUpdateBias, 100, 0), entry(kUpdateLateBias, 0, -100)}) {
    bool flagged = false;
    UpdateToken(u.flags & kUpdateBias ? big : -big, u, repeat2, &flagged);
    EXPECT_FALSE(flagged) << "100 is below float32's ulp at its maximum";
  }
  bool flagged = false;
  UpdateToken(-big, entry(kUpdatePenalize, 0, 0), repeat2, &flagged);  // -big * 2
  EXPECT_TRUE(flagged);
  flagged = false;
  UpdateToken(big, entry(kUpdateLateBias, 0, big), repeat2, &flagged);
  EXPECT_TRUE(flagged);
  flagged = false;
  UpdateToken(-big, entry(kUpdateBias, -big, 0), repeat2, &flagged);
  EXPECT_TRUE(flagged);
}

}  // namespace
}  // namespace samplerd
