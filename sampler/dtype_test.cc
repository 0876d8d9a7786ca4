// Known answers for the 16-bit conversions: IEEE 754 bit patterns written out by hand (not
// computed with the code under test, so a wrong bias or shift cannot agree with itself).
#include "sampler/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace samplerd {
namespace {

TEST(HalfToFloat, KnownAnswers) {
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x3800), 0.5f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);    // fp16's nearest to 1/3
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);           // largest finite
  EXPECT_EQ(HalfToFloat(0x0400), 6.103515625e-05f);   // smallest normal, 2^-14
  EXPECT_EQ(HalfToFloat(0x0001), 5.9604644775390625e-08f);  // smallest subnormal, 2^-24
  EXPECT_EQ(HalfToFloat(0x03FF), 6.0975551605224609375e-05f);  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x4D80), 22.0f);
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_EQ(HalfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
}

TEST(BFloat16ToFloat, KnownAnswers) {
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC040), -3.0f);
  EXPECT_EQ(BFloat16ToFloat(0x3EAB), 0.333984375f);
  EXPECT_EQ(BFloat16ToFloat(0x7F7F), 3.38953138925153547590470800371487866880e+38f);
  EXPECT_EQ(BFloat16ToFloat(0x0001), 9.18354961579912115600575419704879435795832466228193376178712270530013483949005603790283203125e-41f);
  EXPECT_EQ(BFloat16ToFloat(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(0x7FC0)));
}

TEST(FloatToHalf, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);  // overflows to +inf
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3C00);  // a tie: to even
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3C02);  // a tie: to even (up)
  EXPECT_EQ(FloatToHalf(5.9604644775390625e-08f), 0x0001);
}

TEST(FloatToBFloat16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(-3.0f), 0xC040);
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3F80);  // a tie: to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3.0f / 256), 0x3F82);  // a tie: to even (up)
}

}  // namespace
}  // namespace samplerd
