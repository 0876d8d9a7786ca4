// The group state machine, ordering, deadlines and abort handling, against the in-process
// fake transport (no GPU). Deadlines are short (tens of ms) but every wait on the test side
// is bounded generously, so slow CI machines do not flake.
#include "server/group_registry.h"

#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampler/group_packet.h"
#include "server/fake_group_transport.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

GroupConfig Config(int world_size, absl::Duration op_timeout = absl::Seconds(5)) {
  GroupConfig config;
  config.world_size = world_size;
  config.max_step_tokens = 16;
  config.max_logits_bytes = 4096;
  config.join_timeout = absl::Seconds(5);
  config.op_timeout = op_timeout;
  return config;
}

GroupState StateOf(const GroupRegistry& groups, const std::string& id) {
  for (const GroupInfo& info : groups.List()) {
    if (info.group_id == id) return info.state;
  }
  ADD_FAILURE() << "no group " << id;
  return GroupState::kFailed;
}

// Waits (bounded) until the group reaches `state`.
bool WaitFor(const GroupRegistry& groups, const std::string& id, GroupState state) {
  for (int i = 0; i < 5000; ++i) {
    if (StateOf(groups, id) == state) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

std::vector<int32_t> Packet(uint64_t step_id) {
  StepResult result;
  result.step_id = step_id;
  RequestResult r;
  r.token_ids = {static_cast<int32_t>(step_id % 1000), 7};
  result.results.push_back(r);
  return PackStepResult(result, 16).value();
}

struct Fixture {
  FakeGroupHub hub;
  std::vector<std::pair<std::string, std::string>> failures;  // (group, reason)
  absl::Mutex mu;
  GroupRegistry groups{&hub, GroupRegistry::Options{},
                       [this](const std::string& id, const std::string& reason) {
                         absl::MutexLock lock(&mu);
                         failures.emplace_back(id, reason);
                       }};

  // A READY group of `world_size` with its followers.
  std::pair<GroupRegistry::Created, std::vector<FakeFollower*>> Ready(
      int world_size, absl::Duration op_timeout = absl::Seconds(5)) {
    auto created = groups.Create(Config(world_size, op_timeout));
    EXPECT_TRUE(created.ok()) << created.status();
    std::vector<FakeFollower*> followers;
    for (int r = 1; r < world_size; ++r) followers.push_back(hub.Join(created->unique_id, r).value());
    EXPECT_TRUE(WaitFor(groups, created->group_id, GroupState::kReady));
    return {*created, followers};
  }
};

TEST(GroupRegistry, JoinsThenBroadcastsTheSameBytesToEveryFollower) {
  Fixture f;
  auto created = f.groups.Create(Config(3));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->packet_bytes, GroupPacketBytes(16));
  EXPECT_EQ(StateOf(f.groups, created->group_id), GroupState::kJoining);
  // Not every rank joined: steps are refused, naming the field and the group.
  auto early = f.groups.BeginStep(created->group_id, "group_id");
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("still joining"));
  FakeFollower* one = f.hub.Join(created->unique_id, 1).value();
  FakeFollower* two = f.hub.Join(created->unique_id, 2).value();
  EXPECT_FALSE(f.hub.Join(created->unique_id, 2).ok());  // taken
  ASSERT_TRUE(WaitFor(f.groups, created->group_id, GroupState::kReady));

  auto step = f.groups.BeginStep(created->group_id, "group_id");
  ASSERT_TRUE(step.ok()) << step.status();
  std::thread receiver([&] {
    EXPECT_EQ(one->Receive(absl::Seconds(10)).value(), Packet(41));
    EXPECT_EQ(two->Receive(absl::Seconds(10)).value(), Packet(41));
  });
  EXPECT_TRUE((*step)->Broadcast(Packet(41)).ok());
  receiver.join();
  step->reset();
  EXPECT_EQ(f.groups.List()[0].steps, 1);
  EXPECT_EQ(f.groups.failures(), 0);
}

TEST(GroupRegistry, AFollowerThatNeverJoinsFailsTheGroupAtTheJoinTimeout) {
  Fixture f;
  GroupConfig config = Config(2);
  config.join_timeout = absl::Milliseconds(50);
  auto created = f.groups.Create(config);
  ASSERT_TRUE(created.ok());
  ASSERT_TRUE(WaitFor(f.groups, created->group_id, GroupState::kFailed));
  EXPECT_TRUE(f.hub.Aborted(created->unique_id));
  auto step = f.groups.BeginStep(created->group_id, "group_id");
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(step.status().message(), HasSubstr("join timed out"));
  EXPECT_EQ(f.groups.failures(), 1);
  absl::MutexLock lock(&f.mu);
  ASSERT_EQ(f.failures.size(), 1u);
  EXPECT_EQ(f.failures[0].first, created->group_id);
}

TEST(GroupRegistry, StepsOfOneGroupHoldItOneAtATimeInTurnOrder) {
  Fixture f;
  auto [created, followers] = f.Ready(2);
  constexpr int kSteps = 16;
  absl::Mutex mu;
  std::vector<int> events;  // +i when step i starts its turn, -i when it ends
  std::vector<std::thread> threads;
  std::thread receiver([&, follower = followers[0]] {
    std::vector<int32_t> order;
    for (int i = 0; i < kSteps; ++i) order.push_back(follower->Receive(absl::Seconds(20)).value()[2]);
    // The packets arrive in the order the steps held the group.
    absl::MutexLock lock(&mu);
    std::vector<int32_t> starts;
    for (int e : events) {
      if (e > 0) starts.push_back(e);
    }
    EXPECT_EQ(order, starts);
  });
  for (int i = 1; i <= kSteps; ++i) {
    threads.emplace_back([&, i] {
      auto step = f.groups.BeginStep(created.group_id, "group_id");
      ASSERT_TRUE(step.ok()) << step.status();
      {
        absl::MutexLock lock(&mu);
        events.push_back(i);
      }
      absl::SleepFor(absl::Microseconds(300));
      ASSERT_TRUE((*step)->Broadcast(Packet(i)).ok());
      absl::MutexLock lock(&mu);
      events.push_back(-i);
    });
  }
  for (auto& t : threads) t.join();
  receiver.join();
  // Never two steps inside the group at once: every start is followed by its own end.
  ASSERT_EQ(events.size(), 2u * kSteps);
  for (size_t k = 0; k < events.size(); k += 2) EXPECT_EQ(events[k], -events[k + 1]) << k;
}

TEST(GroupRegistry, AFollowerDyingMidStepAbortsOnlyItsGroupWithinTheDeadline) {
  Fixture f;
  auto [a, a_followers] = f.Ready(3, absl::Milliseconds(100));
  auto [b, b_followers] = f.Ready(2, absl::Seconds(5));
  a_followers[1]->Die();
  auto step = f.groups.BeginStep(a.group_id, "group_id");
  ASSERT_TRUE(step.ok());
  // A second step of the same group waits for its turn, and fails with it.
  absl::Status waiter_status;
  std::thread waiter([&] {
    auto next = f.groups.BeginStep(a.group_id, "group_id");
    waiter_status = next.status();
  });
  // Meanwhile group B keeps serving.
  std::atomic<bool> b_done{false};
  std::thread other([&] {
    auto b_step = f.groups.BeginStep(b.group_id, "group_id");
    ASSERT_TRUE(b_step.ok());
    std::thread take([&] { EXPECT_TRUE(b_followers[0]->Receive(absl::Seconds(10)).ok()); });
    EXPECT_TRUE((*b_step)->Broadcast(Packet(5)).ok());
    take.join();
    b_done = true;
  });
  std::thread live([&] { (void)a_followers[0]->Receive(absl::Seconds(10)); });
  const absl::Time start = absl::Now();
  const absl::Status sent = (*step)->Broadcast(Packet(9));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(sent.message(), HasSubstr(a.group_id));
  EXPECT_THAT(sent.message(), HasSubstr("deadline"));
  EXPECT_GE(took, absl::Milliseconds(100));
  EXPECT_LT(took, absl::Seconds(5));
  step->reset();
  waiter.join();
  other.join();
  live.join();
  EXPECT_EQ(waiter_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(b_done);
  EXPECT_EQ(StateOf(f.groups, a.group_id), GroupState::kFailed);
  EXPECT_EQ(StateOf(f.groups, b.group_id), GroupState::kReady);
  EXPECT_TRUE(f.hub.Aborted(a.unique_id));
  EXPECT_FALSE(f.hub.Aborted(b.unique_id));
  EXPECT_EQ(f.groups.BeginStep(a.group_id, "group_id").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.groups.failures(), 1);
}

TEST(GroupRegistry, ASlowFollowerWithinTheDeadlineIsWaitedFor) {
  Fixture f;
  auto [created, followers] = f.Ready(2, absl::Seconds(5));
  auto step = f.groups.BeginStep(created.group_id, "group_id");
  ASSERT_TRUE(step.ok());
  std::thread slow([&] {
    absl::SleepFor(absl::Milliseconds(60));
    EXPECT_TRUE(followers[0]->Receive(absl::Seconds(10)).ok());
  });
  EXPECT_TRUE((*step)->Broadcast(Packet(3)).ok());
  slow.join();
  EXPECT_EQ(StateOf(f.groups, created.group_id), GroupState::kReady);
}

TEST(GroupRegistry, ReceivesLogitsFromFollowersIntoAlignedSlices) {
  Fixture f;
  auto [created, followers] = f.Ready(3);
  auto step = f.groups.BeginStep(created.group_id, "group_id");
  ASSERT_TRUE(step.ok());
  followers[0]->Send(std::vector<unsigned char>(100, 0xab));
  followers[1]->Send(std::vector<unsigned char>(40, 0xcd));
  bool on_device = true;
  auto first = (*step)->ReceiveLogits(100, 1, "logits.shards[0]", &on_device);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(on_device);
  auto second = (*step)->ReceiveLogits(40, 2, "logits.shards[1]", &on_device);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(static_cast<const char*>(*second) - static_cast<const char*>(*first), 256);
  EXPECT_EQ(static_cast<const unsigned char*>(*first)[99], 0xab);
  EXPECT_EQ(static_cast<const unsigned char*>(*second)[0], 0xcd);
  EXPECT_EQ(static_cast<const unsigned char*>(*second)[39], 0xcd);
}

TEST(GroupRegistry, AReceiveThatCannotMatchItsSendFailsTheStepAndTheGroup) {
  for (const auto& [bytes, rank, needle] :
       std::vector<std::tuple<int64_t, int, std::string>>{
           {64, 0, "src_rank"}, {64, 2, "src_rank"}, {8192, 1, "max_logits_bytes"}}) {
    Fixture f;
    auto [created, followers] = f.Ready(2);
    auto step = f.groups.BeginStep(created.group_id, "group_id");
    ASSERT_TRUE(step.ok());
    bool on_device;
    auto received = (*step)->ReceiveLogits(bytes, rank, "logits", &on_device);
    EXPECT_EQ(received.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(received.status().message(), HasSubstr(needle));
    EXPECT_EQ(StateOf(f.groups, created.group_id), GroupState::kFailed);
  }
}

TEST(GroupRegistry, MismatchedSendSizesAndAsyncErrorsFailTheGroup) {
  Fixture f;
  auto [created, followers] = f.Ready(2);
  {
    auto step = f.groups.BeginStep(created.group_id, "group_id");
    ASSERT_TRUE(step.ok());
    followers[0]->Send(std::vector<unsigned char>(10));
    bool on_device;
    auto received = (*step)->ReceiveLogits(12, 1, "logits", &on_device);
    EXPECT_EQ(received.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(received.status().message(), HasSubstr("sent 10 bytes"));
  }
  // An asynchronous error while idle: the watchdog finds it.
  auto [idle, idle_followers] = f.Ready(2);
  idle_followers[0]->RaiseAsyncError("remote process exited");
  ASSERT_TRUE(WaitFor(f.groups, idle.group_id, GroupState::kFailed));
  auto info = f.groups.List();
  for (const GroupInfo& i : info) {
    if (i.group_id == idle.group_id) {
      EXPECT_THAT(i.error, HasSubstr("remote process exited"));
    }
  }
  EXPECT_EQ(f.groups.failures(), 2);
}

TEST(GroupRegistry, DestroySendsAClosingPacketAndANewGroupWorksAfterwards) {
  Fixture f;
  auto [created, followers] = f.Ready(2);
  std::vector<int32_t> closing;
  std::thread receiver([&] { closing = followers[0]->Receive(absl::Seconds(10)).value(); });
  ASSERT_TRUE(f.groups.Destroy(created.group_id).ok());
  receiver.join();
  auto packet = UnpackGroupPacket(closing.data(), closing.size());
  ASSERT_TRUE(packet.ok());
  EXPECT_EQ(packet->step_status_code, static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(closing[7], 1);  // flags: closing
  EXPECT_TRUE(f.groups.List().empty());
  EXPECT_EQ(f.groups.BeginStep(created.group_id, "group_id").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(f.groups.Destroy(created.group_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.groups.failures(), 0);  // destroying is not failing
  auto [again, again_followers] = f.Ready(2);
  EXPECT_NE(again.group_id, created.group_id);
  auto step = f.groups.BeginStep(again.group_id, "group_id");
  ASSERT_TRUE(step.ok());
  std::thread take([&] { EXPECT_TRUE(again_followers[0]->Receive(absl::Seconds(10)).ok()); });
  EXPECT_TRUE((*step)->Broadcast(Packet(1)).ok());
  take.join();
}

TEST(GroupRegistry, ShutdownLetsTheStepInProgressFinishThenClosesEveryGroup) {
  Fixture f;
  auto [created, followers] = f.Ready(2);
  auto step = f.groups.BeginStep(created.group_id, "group_id");
  ASSERT_TRUE(step.ok());
  std::vector<std::vector<int32_t>> got;
  std::thread receiver([&] {
    for (int i = 0; i < 2; ++i) got.push_back(followers[0]->Receive(absl::Seconds(10)).value());
  });
  std::thread finishing([&] {
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_TRUE((*step)->Broadcast(Packet(8)).ok());
    step->reset();
  });
  f.groups.Shutdown(absl::Seconds(10));
  finishing.join();
  receiver.join();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], Packet(8));
  EXPECT_EQ(got[1][7], 1);  // then the closing packet
  EXPECT_EQ(f.groups.BeginStep(created.group_id, "group_id").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(GroupRegistry, ValidatesCreateAndBoundsTheNumberOfGroups) {
  Fixture f;
  GroupConfig config = Config(0);
  EXPECT_THAT(f.groups.Create(config).status().message(), HasSubstr("world_size"));
  config = Config(2);
  config.max_step_tokens = 0;
  EXPECT_THAT(f.groups.Create(config).status().message(), HasSubstr("max_step_tokens"));
  config.max_step_tokens = (1 << 20) + 1;  // more tokens than a step can emit
  EXPECT_THAT(f.groups.Create(config).status().message(), HasSubstr("max_step_tokens"));
  config = Config(2);
  config.max_logits_bytes = (int64_t{1} << 30) + 1;
  EXPECT_THAT(f.groups.Create(config).status().message(), HasSubstr("max_logits_bytes"));
  config = Config(2);
  config.join_timeout = absl::Hours(1);
  EXPECT_THAT(f.groups.Create(config).status().message(), HasSubstr("join_timeout_ms"));
  config = Config(2);
  config.op_timeout = -absl::Seconds(1);
  EXPECT_THAT(f.groups.Create(config).status().message(), HasSubstr("op_timeout_ms"));
  EXPECT_EQ(f.groups.BeginStep("nope", "group_id").status().code(), absl::StatusCode::kNotFound);

  GroupRegistry none(nullptr, GroupRegistry::Options{});
  EXPECT_EQ(none.Create(Config(2)).status().code(), absl::StatusCode::kFailedPrecondition);

  FakeGroupHub hub;
  GroupRegistry::Options options;
  options.max_groups = 2;
  GroupRegistry small(&hub, options);
  EXPECT_TRUE(small.Create(Config(2)).ok());
  EXPECT_TRUE(small.Create(Config(2)).ok());
  EXPECT_EQ(small.Create(Config(2)).status().code(), absl::StatusCode::kResourceExhausted);

  // A failed group gives its slot up to a new one.
  options.max_groups = 1;
  GroupRegistry one(&hub, options);
  GroupConfig lonely = Config(2);
  lonely.join_timeout = absl::Milliseconds(20);
  auto failed = one.Create(lonely);
  ASSERT_TRUE(failed.ok());
  ASSERT_TRUE(WaitFor(one, failed->group_id, GroupState::kFailed));
  auto next = one.Create(Config(2));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(one.List().size(), 1u);
  EXPECT_EQ(one.List()[0].group_id, next->group_id);
}

}  // namespace
}  // namespace samplerd
