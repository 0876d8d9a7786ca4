#include "sampler/token_scan.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace samplerd {
namespace {

using namespace token_scan_internal;

// Every variant this CPU has against the plain loop, on random contexts of every length up to
// 200 (whole vector blocks, partial ones, none) and a small alphabet (many hits a block).
TEST(FindToken, EveryVariantAgreesWithTheLoop) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int32_t> data(static_cast<size_t>(trial % 200));
    const int32_t alphabet = 1 + static_cast<int32_t>(rng() % 8);
    for (int32_t& t : data) t = static_cast<int32_t>(rng() % alphabet) - 1;  // -1 included
    const int32_t token = static_cast<int32_t>(rng() % alphabet) - 1;
    TokenPositions want, got;
    FindTokenLoop(data.data(), data.size(), token, want);
    FindToken(data.data(), data.size(), token, got);
    ASSERT_EQ(got, want) << "trial " << trial;
    if (HasSse2()) {
      got.clear();
      FindTokenSse2(data.data(), data.size(), token, got);
      ASSERT_EQ(got, want) << "SSE2, trial " << trial;
    }
    if (HasAvx2()) {
      got.clear();
      FindTokenAvx2(data.data(), data.size(), token, got);
      ASSERT_EQ(got, want) << "AVX2, trial " << trial;
    }
  }
}

TEST(FindToken, AppendsAfterWhatIsThere) {
  const std::vector<int32_t> data(40, 3);
  TokenPositions at = {99};
  FindToken(data.data(), data.size(), 3, at);
  ASSERT_EQ(at.size(), 41u);
  EXPECT_EQ(at[0], 99u);
  EXPECT_EQ(at[1], 0u);
  EXPECT_EQ(at[40], 39u);
}

// Runs that differ at every distance from the end, and limits cutting them.
TEST(CommonSuffix, AgreesWithTheLoop) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t n = 1 + rng() % 80;
    std::vector<int32_t> a(n), b(n);
    for (size_t k = 0; k < n; ++k) a[k] = b[k] = static_cast<int32_t>(rng() % 1000);
    if (rng() % 4 != 0) b[rng() % n] += 1;  // one difference, anywhere (or none)
    const size_t limit = rng() % (n + 1);
    ASSERT_EQ(CommonSuffix(a.data() + n, b.data() + n, limit),
              CommonSuffixLoop(a.data() + n, b.data() + n, limit))
        << "trial " << trial;
  }
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, b = {9, 2, 3, 4, 5, 6};
  EXPECT_EQ(CommonSuffix(a.data() + 6, b.data() + 6, 6), 5u);
  EXPECT_EQ(CommonSuffix(a.data() + 6, b.data() + 6, 3), 3u);
  EXPECT_EQ(CommonSuffix(a.data() + 6, b.data() + 6, 0), 0u);
}

}  // namespace
}  // namespace samplerd
