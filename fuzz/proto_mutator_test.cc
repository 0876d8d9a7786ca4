#include "fuzz/proto_mutator.h"

#include <gtest/gtest.h>

#include <random>

#include "samplerd/v1/sampler.pb.h"

namespace samplerd {
namespace {

// Mutations always leave a message that serializes and parses back to itself, and they reach
// deep fields (a request's params, the logits' shards) starting from an empty message.
TEST(ProtoMutator, MutantsRoundTripAndReachNestedFields) {
  std::mt19937_64 rng(7);
  v1::SampleRequestList list;
  bool saw_params = false, saw_shards = false;
  for (int i = 0; i < 5000; ++i) {
    MutateMessage(&list, rng);
    if (list.ByteSizeLong() > (256 << 10)) list.Clear();  // keep the walk small
    std::string bytes;
    ASSERT_TRUE(list.SerializeToString(&bytes));
    v1::SampleRequestList back;
    ASSERT_TRUE(back.ParseFromString(bytes));
    ASSERT_EQ(back.SerializeAsString(), bytes);
    for (const auto& step : list.steps()) {
      saw_shards |= step.logits().shards_size() > 0;
      for (const auto& r : step.inputs().requests()) saw_params |= r.has_params();
    }
  }
  EXPECT_TRUE(saw_params);
  EXPECT_TRUE(saw_shards);
}

}  // namespace
}  // namespace samplerd
