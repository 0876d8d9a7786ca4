#include "sampler/range_allocator.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

TEST(RangeAllocator, FirstFitAlignedAndCoalesced) {
  RangeAllocator ranges(1000, 32);
  EXPECT_EQ(ranges.capacity(), 992);  // whole aligned units only
  EXPECT_EQ(ranges.Reserved(33), 64);
  const auto a = ranges.Allocate(100);  // 128
  const auto b = ranges.Allocate(100);  // 128
  const auto c = ranges.Allocate(100);  // 128
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0);
  EXPECT_EQ(*b, 128);
  EXPECT_EQ(*c, 256);
  EXPECT_EQ(ranges.used(), 384);
  ranges.Free(*b);
  EXPECT_EQ(ranges.Allocate(200), 384);  // b's hole (128) is too small: after c
  EXPECT_EQ(ranges.Allocate(64), 128);   // first fit: b's hole
  ranges.Free(128);
  ranges.Free(*a);
  EXPECT_EQ(ranges.Allocate(256), 0);  // a and b's ranges merged
  EXPECT_FALSE(ranges.Allocate(993).has_value());
  EXPECT_FALSE(ranges.Allocate(0).has_value());
}

TEST(RangeAllocator, FragmentationLeavesNoFitThenFreesBackToOneRange) {
  RangeAllocator ranges(10 * 32, 32);
  std::vector<int64_t> at;
  for (int i = 0; i < 10; ++i) at.push_back(*ranges.Allocate(32));
  EXPECT_FALSE(ranges.Allocate(1).has_value());  // full
  for (int i = 0; i < 10; i += 2) ranges.Free(at[i]);
  EXPECT_EQ(ranges.used(), 5 * 32);
  EXPECT_EQ(ranges.largest_free(), 32);
  EXPECT_FALSE(ranges.Allocate(64).has_value());  // 160 free, none of it contiguous
  for (int i = 1; i < 10; i += 2) ranges.Free(at[i]);
  EXPECT_EQ(ranges.used(), 0);
  EXPECT_EQ(ranges.largest_free(), 320);
}

// Random allocations and frees (seed 7) against a map of owned units: no two live ranges
// overlap, every range lies inside the capacity, and freeing everything restores one range.
TEST(RangeAllocator, RandomTraceNeverOverlaps) {
  constexpr int64_t kCapacity = 4096;
  RangeAllocator ranges(kCapacity, 8);
  std::vector<int> owner(kCapacity, -1);
  std::vector<std::pair<int64_t, int64_t>> live;  // offset, reserved size
  std::mt19937 rng(7);
  int allocations = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const int64_t size = 1 + rng() % 300;
      const auto at = ranges.Allocate(size);
      if (!at) {
        EXPECT_LT(ranges.largest_free(), ranges.Reserved(size));
        continue;
      }
      const int64_t reserved = ranges.Reserved(size);
      ASSERT_EQ(*at % 8, 0);
      ASSERT_LE(*at + reserved, kCapacity);
      for (int64_t u = *at; u < *at + reserved; ++u) {
        ASSERT_EQ(owner[u], -1) << "unit " << u << " handed out twice";
        owner[u] = step;
      }
      live.emplace_back(*at, reserved);
      ++allocations;
    } else {
      const size_t k = rng() % live.size();
      ranges.Free(live[k].first);
      for (int64_t u = live[k].first; u < live[k].first + live[k].second; ++u) owner[u] = -1;
      live.erase(live.begin() + k);
    }
  }
  EXPECT_GT(allocations, 5000);
  for (const auto& [offset, size] : live) ranges.Free(offset);
  EXPECT_EQ(ranges.used(), 0);
  EXPECT_EQ(ranges.largest_free(), kCapacity);
}

}  // namespace
}  // namespace samplerd
