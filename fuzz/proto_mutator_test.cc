#include "fuzz/proto_mutator.h"

#include <gtest/gtest.h>

#include <random>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "samplerd/v1/sampler.pb.h"

namespace samplerd {
namespace {

std::string Deterministic(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&coded);
  return out;
}

// Mutations always leave a message that serializes and parses back, and they reach deep
// fields (a request's params and its logit_bias map, the logits' shards) starting from an
// empty message. A map field is mutated as its repeated entries, so a mutant may name a key
// twice (valid on the wire: the last entry wins): the parsed message, not the mutant's bytes,
// is the fixed point.
TEST(ProtoMutator, MutantsRoundTripAndReachNestedFields) {
  std::mt19937_64 rng(7);
  v1::SampleRequestList list;
  bool saw_params = false, saw_shards = false, saw_bias = false;
  for (int i = 0; i < 5000; ++i) {
    MutateMessage(&list, rng);
    if (list.ByteSizeLong() > (256 << 10)) list.Clear();  // keep the walk small
    std::string bytes;
    ASSERT_TRUE(list.SerializeToString(&bytes));
    v1::SampleRequestList back;
    ASSERT_TRUE(back.ParseFromString(bytes));
    const std::string once = Deterministic(back);
    v1::SampleRequestList again;
    ASSERT_TRUE(again.ParseFromString(once));
    ASSERT_EQ(Deterministic(again), once);
    for (const auto& step : list.steps()) {
      saw_shards |= step.logits().shards_size() > 0;
      for (const auto& r : step.inputs().requests()) {
        saw_params |= r.has_params();
        saw_bias |= r.params().logit_bias_size() > 0;
      }
    }
  }
  EXPECT_TRUE(saw_params);
  EXPECT_TRUE(saw_shards);
  EXPECT_TRUE(saw_bias);
}

}  // namespace
}  // namespace samplerd
