#include "sampler/row_layout.h"

#include <gtest/gtest.h>

namespace samplerd {
namespace {

TEST(VerificationMetadata, MatchesSixSixFourWorkedExample) {
  const VerificationMetadata m = BuildVerificationMetadata({6, 6, 4});
  EXPECT_EQ(m.first_row, (std::vector<int32_t>{0, 6, 12}));
  EXPECT_EQ(m.row_to_req,
            (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(m.local_step,
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3}));
  const std::vector<bool> T_F = {true, true, true, true, true, false, true, true,
                                 true, true, true, false, true, true, true, false};
  EXPECT_EQ(m.is_verify, T_F);
}

TEST(VerificationMetadata, SingleRowRequestOnlySamples) {
  const VerificationMetadata m = BuildVerificationMetadata({1});
  EXPECT_EQ(m.is_verify, std::vector<bool>{false});
}

}  // namespace
}  // namespace samplerd
