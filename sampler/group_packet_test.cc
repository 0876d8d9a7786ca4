#include "sampler/group_packet.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::ElementsAre;

StepResult TwoRequests() {
  StepResult result;
  result.step_id = (uint64_t{7} << 32) | 0x9abcdef0u;  // both halves of the id matter
  RequestResult a;
  a.request_id = "a";
  a.token_ids = {5, 6, 7};
  a.num_accepted = 2;
  RequestResult b;
  b.request_id = "b";
  b.status = absl::InvalidArgumentError("top_p");
  b.token_ids = {99};  // a failed request's leftovers are not sent
  RequestResult c;
  c.request_id = "c";
  c.token_ids = {-1 + 1, 41};
  result.results = {a, b, c};
  return result;
}

TEST(GroupPacket, RoundTripsTokensAcceptCountsAndStatuses) {
  const auto words = PackStepResult(TwoRequests(), 8);
  ASSERT_TRUE(words.ok()) << words.status();
  ASSERT_EQ(static_cast<int64_t>(words->size()), GroupPacketWords(8));
  EXPECT_EQ(GroupPacketBytes(8), 4 * (8 + 8 * 4));
  // The documented layout, word by word.
  EXPECT_EQ((*words)[0], kGroupPacketMagic);
  EXPECT_EQ((*words)[1], 1);
  EXPECT_EQ(static_cast<uint32_t>((*words)[2]), 0x9abcdef0u);
  EXPECT_EQ((*words)[3], 7);
  EXPECT_EQ((*words)[4], 0);
  EXPECT_EQ((*words)[5], 3);
  EXPECT_EQ((*words)[6], 5);
  EXPECT_THAT(std::vector<int32_t>(words->begin() + 8, words->begin() + 17),
              ElementsAre(0, 2, 3, 3, 0, 0, 0, 0, 2));
  EXPECT_THAT(std::vector<int32_t>(words->begin() + 17, words->begin() + 22),
              ElementsAre(5, 6, 7, 0, 41));
  for (size_t i = 22; i < words->size(); ++i) EXPECT_EQ((*words)[i], 0) << i;

  const auto packet = UnpackGroupPacket(words->data(), words->size());
  ASSERT_TRUE(packet.ok()) << packet.status();
  EXPECT_EQ(packet->step_id, TwoRequests().step_id);
  EXPECT_EQ(packet->step_status_code, 0);
  ASSERT_EQ(packet->requests.size(), 3u);
  EXPECT_THAT(packet->requests[0].token_ids, ElementsAre(5, 6, 7));
  EXPECT_EQ(packet->requests[0].num_accepted, 2);
  EXPECT_EQ(packet->requests[1].status_code, 3);
  EXPECT_TRUE(packet->requests[1].token_ids.empty());
  EXPECT_THAT(packet->requests[2].token_ids, ElementsAre(0, 41));
}

TEST(GroupPacket, StepErrorsCarryTheCodeAndNoRequests) {
  const std::vector<int32_t> words = PackStepError(12, absl::NotFoundError("buffer"), 4);
  const auto packet = UnpackGroupPacket(words.data(), words.size());
  ASSERT_TRUE(packet.ok());
  EXPECT_EQ(packet->step_id, 12u);
  EXPECT_EQ(packet->step_status_code, static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(packet->requests.empty());
}

TEST(GroupPacket, RefusesStepsBeyondTheCapacity) {
  EXPECT_EQ(PackStepResult(TwoRequests(), 4).status().code(),
            absl::StatusCode::kInvalidArgument);  // 5 tokens > 4
  EXPECT_EQ(PackStepResult(TwoRequests(), 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // 3 requests > 2
  EXPECT_EQ(GroupPacketWords(0), -1);
  EXPECT_EQ(GroupPacketWords((int64_t{1} << 24) + 1), -1);
}

TEST(GroupPacket, UnpackRejectsCorruptPackets) {
  std::vector<int32_t> words = PackStepResult(TwoRequests(), 8).value();
  std::vector<int32_t> bad = words;
  bad[0] = 0;
  EXPECT_FALSE(UnpackGroupPacket(bad.data(), bad.size()).ok());
  bad = words;
  bad[1] = 2;
  EXPECT_FALSE(UnpackGroupPacket(bad.data(), bad.size()).ok());
  bad = words;
  bad[6] = 1 << 30;  // more tokens than the buffer
  EXPECT_FALSE(UnpackGroupPacket(bad.data(), bad.size()).ok());
  bad = words;
  bad[10] = 4;  // request 0 claims one token too many
  EXPECT_FALSE(UnpackGroupPacket(bad.data(), bad.size()).ok());
  EXPECT_FALSE(UnpackGroupPacket(words.data(), 4).ok());
}

}  // namespace
}  // namespace samplerd
