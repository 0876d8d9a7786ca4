// Context-parallel groups on real NCCL with one GPU (gpu tag): a group of one joins and
// broadcasts; create/destroy cycles leave nothing behind; a group whose follower never joins
// fails at its join timeout and its communicator is aborted promptly. What needs two ranks on
// two GPUs is tests/multi_gpu_group_test (NCCL allows one rank per GPU per communicator).
#include <cuda_runtime.h>

#include "cuda/nccl_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampler/group_packet.h"
#include "server/group_registry.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

GroupConfig Config(int world_size) {
  GroupConfig config;
  config.world_size = world_size;
  config.max_step_tokens = 1024;
  config.max_logits_bytes = 16 << 20;
  config.join_timeout = absl::Seconds(30);
  config.op_timeout = absl::Seconds(10);
  return config;
}

GroupState WaitWhileJoining(const GroupRegistry& groups, const std::string& id) {
  for (int i = 0; i < 30000; ++i) {
    for (const GroupInfo& info : groups.List()) {
      if (info.group_id == id && info.state != GroupState::kJoining) return info.state;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return GroupState::kJoining;
}

size_t DeviceBytesUsed() {
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  return total - free_bytes;
}

TEST(NcclGroup, AGroupOfOneJoinsBroadcastsAndIsDestroyedCleanly) {
  auto transport = NcclTransport::Create(0);
  ASSERT_TRUE(transport.ok()) << transport.status();
  std::printf("transport: %s\n", (*transport)->Describe().c_str());
  GroupRegistry groups(transport->get(), GroupRegistry::Options{});
  // Warm up NCCL and the CUDA context once, so the memory comparison below sees only groups.
  {
    auto created = groups.Create(Config(1));
    ASSERT_TRUE(created.ok()) << created.status();
    ASSERT_EQ(WaitWhileJoining(groups, created->group_id), GroupState::kReady);
    ASSERT_TRUE(groups.Destroy(created->group_id).ok());
  }
  const size_t before = DeviceBytesUsed();
  for (int cycle = 0; cycle < 20; ++cycle) {
    auto created = groups.Create(Config(1));
    ASSERT_TRUE(created.ok()) << created.status();
    EXPECT_EQ(created->unique_id.size(), 128u);
    ASSERT_EQ(WaitWhileJoining(groups, created->group_id), GroupState::kReady) << cycle;
    for (int s = 0; s < 5; ++s) {
      auto step = groups.BeginStep(created->group_id, "group_id");
      ASSERT_TRUE(step.ok()) << step.status();
      StepResult result;
      result.step_id = static_cast<uint64_t>(s);
      result.results.resize(3);
      for (auto& r : result.results) r.token_ids = {1, 2, 3};
      ASSERT_TRUE((*step)->Broadcast(PackStepResult(result, 1024).value()).ok());
    }
    ASSERT_TRUE(groups.Destroy(created->group_id).ok());
  }
  const size_t after = DeviceBytesUsed();
  std::printf("device memory after 20 create/destroy cycles: %+.1f MiB\n",
              (static_cast<double>(after) - static_cast<double>(before)) / (1 << 20));
  EXPECT_LT(after, before + (64u << 20)) << "groups leak device memory";
  EXPECT_EQ(groups.failures(), 0);
}

TEST(NcclGroup, AFollowerThatNeverJoinsIsAbortedAtTheJoinTimeout) {
  auto transport = NcclTransport::Create(0);
  ASSERT_TRUE(transport.ok());
  GroupRegistry groups(transport->get(), GroupRegistry::Options{});
  GroupConfig config = Config(2);
  config.join_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto created = groups.Create(config);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(WaitWhileJoining(groups, created->group_id), GroupState::kFailed);
  const absl::Duration took = absl::Now() - start;
  std::printf("join timeout 500 ms: FAILED after %lld ms\n",
              static_cast<long long>(absl::ToInt64Milliseconds(took)));
  EXPECT_LT(took, absl::Seconds(5));
  auto step = groups.BeginStep(created->group_id, "group_id");
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(step.status().message(), HasSubstr("join timed out"));
  EXPECT_EQ(groups.failures(), 1);
  EXPECT_TRUE(groups.Destroy(created->group_id).ok());
  // The next group still works.
  auto next = groups.Create(Config(1));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(WaitWhileJoining(groups, next->group_id), GroupState::kReady);
}

TEST(NcclGroup, RefusesAGroupOnAnotherDevice) {
  auto transport = NcclTransport::Create(0);
  ASSERT_TRUE(transport.ok());
  GroupRegistry groups(transport->get(), GroupRegistry::Options{});
  GroupConfig config = Config(1);
  config.device_id = 5;
  auto created = groups.Create(config);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(created.status().message(), HasSubstr("device_id"));
}

}  // namespace
}  // namespace samplerd
