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

}  // namespace
}  // namespace samplerd
