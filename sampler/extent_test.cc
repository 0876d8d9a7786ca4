#include "sampler/extent.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"
#include "sampler/memory_budget.h"

namespace samplerd {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(TensorByteExtent, PlainAndStrided) {
  EXPECT_EQ(*TensorByteExtent(2, 3, 3, 4, "t"), 24);
  EXPECT_EQ(*TensorByteExtent(2, 3, 10, 2, "t"), (10 + 3) * 2);
  EXPECT_EQ(*TensorByteExtent(1, 5, kMax, 4, "t"), 20);  // one row: the stride is never used
}

TEST(TensorByteExtent, RefusesShapesAndNamesTheField) {
  EXPECT_EQ(TensorByteExtent(0, 3, 3, 4, "logits").status().message(),
            "logits.rows: 0 must be >= 1");
  EXPECT_EQ(TensorByteExtent(1, -1, 3, 4, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorByteExtent(2, 3, 2, 4, "x").status().message(),
            "x.row_stride: 2 is less than cols = 3");
}

// The 40-byte request: a row_stride whose extent wrapped around to a small number.
TEST(TensorByteExtent, RefusesEveryOverflow) {
  // (rows - 1) * stride overflows.
  EXPECT_FALSE(TensorByteExtent(2, 1, kMax, 4, "t").ok());
  // ... + cols overflows.
  EXPECT_FALSE(TensorByteExtent(2, 2, kMax - 1, 1, "t").ok());
  // * elem_size overflows (the wrap that once read outside the request).
  EXPECT_FALSE(TensorByteExtent(2, 1, int64_t{1} << 62, 4, "t").ok());
  EXPECT_FALSE(TensorByteExtent(3, 1, (int64_t{1} << 62) + 1, 4, "t").ok());
  // Exhaustive over strides near the int64 edge: an accepted extent is always the exact value.
  for (int64_t rows : {2, 3, 7, 1 << 20}) {
    for (int64_t stride = kMax / rows - 8; stride < kMax / rows + 8; ++stride) {
      auto extent = TensorByteExtent(rows, 1, stride, 2, "t");
      const __int128 exact = (static_cast<__int128>(rows - 1) * stride + 1) * 2;
      if (extent.ok()) {
        EXPECT_EQ(static_cast<__int128>(*extent), exact);
      } else {
        EXPECT_GT(exact, static_cast<__int128>(kMax));
      }
    }
  }
}

TEST(CheckSliceWithin, Bounds) {
  EXPECT_TRUE(CheckSliceWithin(0, 10, 10, "f", "w").ok());
  EXPECT_TRUE(CheckSliceWithin(10, 0, 10, "f", "w").ok());
  EXPECT_FALSE(CheckSliceWithin(1, 10, 10, "f", "w").ok());
  EXPECT_FALSE(CheckSliceWithin(-1, 1, 10, "f", "w").ok());
  EXPECT_FALSE(CheckSliceWithin(11, 0, 10, "f", "w").ok());
  EXPECT_FALSE(CheckSliceWithin(kMax, kMax, 10, "f", "w").ok());  // offset + extent wraps
  EXPECT_FALSE(CheckSliceWithin(5, kMax, 10, "f", "w").ok());
  EXPECT_EQ(CheckSliceWithin(8, 4, 10, "logits.buffer.byte_offset", "buffer 'b' of 10 bytes")
                .message(),
            "logits.buffer.byte_offset: the slice of 4 bytes at offset 8 exceeds buffer 'b' of "
            "10 bytes");
}

TEST(MemoryBudget, ReservesAndReleases) {
  MemoryBudget budget(100);
  auto a = budget.Reserve(60, "a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(budget.used(), 60);
  auto b = budget.Reserve(41, "b");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("b: needs 41 bytes"), absl::string_view::npos);
  auto c = budget.Reserve(40, "c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(budget.used(), 100);
  a->reset();
  EXPECT_EQ(budget.used(), 40);
  EXPECT_FALSE(budget.Reserve(-1, "d").ok());
  EXPECT_FALSE(budget.Reserve(kMax, "e").ok());
}

}  // namespace
}  // namespace samplerd
