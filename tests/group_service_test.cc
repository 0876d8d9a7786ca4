// Context-parallel groups through the real gRPC service (in this process, on port 0) with the
// CPU backend and the in-process fake transport in place of NCCL: CreateGroup, steps whose
// broadcast packets carry exactly the tokens of the gRPC answers, NCCL logits from a follower
// sampled like the same logits inline, a follower dying mid-step (UNAVAILABLE naming the
// group; other clients keep being served), GetServerInfo's groups, DestroyGroup. The NCCL
// transport itself runs on GPUs (cuda/nccl_group_test, tests/multi_gpu_group_test).
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <thread>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampler/cpu_backend.h"
#include "sampler/group_packet.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "server/fake_group_transport.h"
#include "server/sampler_service.h"
#include "tests/group_rpc.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

class GroupServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CpuBackendOptions cpu;
    cpu.num_threads = 2;
    backend_ = CpuBackend::Create(cpu).value();
    metrics_ = Metrics::Create("").value();
    registry_ = std::make_unique<BufferRegistry>(BufferRegistryOptions{});
    GroupRegistry::Options options;
    options.max_logits_bytes = 1 << 20;
    groups_ = std::make_unique<GroupRegistry>(&hub_, options);
    service_ = std::make_unique<SamplerService>(*backend_, *registry_, *groups_, *metrics_,
                                                ServiceOptions{}, [] { return uint64_t{7}; });
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = v1::Sampler::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                      grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown();
    groups_.reset();
  }

  // A READY group with its followers.
  std::pair<v1::CreateGroupResponse, std::vector<FakeFollower*>> ReadyGroup(
      int world_size, int op_timeout_ms = 10000) {
    v1::CreateGroupRequest request;
    request.set_world_size(world_size);
    request.set_max_step_tokens(64);
    request.set_max_logits_bytes(1 << 16);
    request.set_op_timeout_ms(op_timeout_ms);
    v1::CreateGroupResponse created;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->CreateGroup(&context, request, &created).ok());
    std::vector<FakeFollower*> followers;
    for (int r = 1; r < world_size; ++r) {
      followers.push_back(hub_.Join(created.nccl_unique_id(), r).value());
    }
    for (int i = 0; i < 5000 && State(created.group_id()) != v1::READY; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(State(created.group_id()), v1::READY);
    return {created, followers};
  }

  v1::GroupState State(const std::string& id) { return GroupStateOf(*stub_, id); }

  grpc::Status Sample(const v1::SampleRequest& request, v1::SampleResponse* response) {
    return SampleOnce(*stub_, request, response);
  }

  FakeGroupHub hub_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<BufferRegistry> registry_;
  std::unique_ptr<GroupRegistry> groups_;
  std::unique_ptr<SamplerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

TEST_F(GroupServiceTest, BroadcastPacketsCarryTheAnswersTokensBitwise) {
  auto [group, followers] = ReadyGroup(3);
  EXPECT_EQ(group.packet_bytes(), GroupPacketBytes(64));
  EXPECT_EQ(group.layout_version(), 1);
  constexpr int kSteps = 50;
  std::vector<std::vector<std::vector<int32_t>>> received(2);
  std::vector<std::thread> threads;
  for (int f = 0; f < 2; ++f) {
    threads.emplace_back([&, f] {
      for (int s = 0; s < kSteps; ++s) {
        received[f].push_back(followers[f]->Receive(absl::Seconds(30)).value());
      }
    });
  }
  std::vector<v1::SampleResponse> responses(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    v1::SampleRequest request = SmallStep(1000 + s, /*n=*/4, /*vocab=*/64, /*seed=*/s + 1);
    request.set_group_id(group.group_id());
    if (s % 10 == 3) request.mutable_inputs()->mutable_requests(2)->mutable_params()->set_top_p(7);
    ASSERT_TRUE(Sample(request, &responses[s]).ok());
    EXPECT_GE(responses[s].timing().group_us(), 0);
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < kSteps; ++s) {
    for (int f = 0; f < 2; ++f) {
      const auto packet = UnpackGroupPacket(received[f][s].data(), received[f][s].size());
      ASSERT_TRUE(packet.ok());
      EXPECT_EQ(packet->step_id, 1000u + s);
      ASSERT_EQ(packet->requests.size(), 4u);
      for (int r = 0; r < 4; ++r) {
        const v1::RequestResult& want = responses[s].results(r);
        EXPECT_EQ(packet->requests[r].status_code, want.status().code());
        EXPECT_EQ(packet->requests[r].token_ids,
                  std::vector<int32_t>(want.token_ids().begin(), want.token_ids().end()));
        EXPECT_EQ(packet->requests[r].num_accepted, want.num_accepted());
      }
    }
    EXPECT_EQ(received[0][s], received[1][s]);  // the same bytes on every rank
  }
  // A step that fails as a whole still broadcasts: its error, so followers stay in step.
  v1::SampleRequest bad = SmallStep(77, 2);
  bad.set_group_id(group.group_id());
  bad.mutable_logits()->set_cols(-1);
  absl::StatusOr<std::vector<int32_t>> packet;
  std::thread take([&] {
    packet = followers[0]->Receive(absl::Seconds(10));
    (void)followers[1]->Receive(absl::Seconds(10));
  });
  v1::SampleResponse response;
  EXPECT_EQ(Sample(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  take.join();
  ASSERT_TRUE(packet.ok());
  EXPECT_EQ((*packet)[4], static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(UnpackGroupPacket(packet->data(), packet->size())->step_id, 77u);
}

TEST_F(GroupServiceTest, NcclLogitsFromAFollowerAreSampledLikeTheSameLogitsInline) {
  auto [group, followers] = ReadyGroup(2);
  for (int s = 0; s < 5; ++s) {
    v1::SampleRequest inline_step = SmallStep(s, /*n=*/3, /*vocab=*/80, /*seed=*/s + 11);
    const auto& values = inline_step.logits().values().values();
    std::vector<unsigned char> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    followers[0]->Send(bytes);
    v1::SampleRequest nccl_step = inline_step;
    nccl_step.mutable_logits()->mutable_nccl()->set_group_id(group.group_id());
    nccl_step.mutable_logits()->mutable_nccl()->set_src_rank(1);
    nccl_step.mutable_logits()->set_dtype(v1::FLOAT32);
    v1::SampleResponse by_nccl, by_inline;
    ASSERT_TRUE(Sample(nccl_step, &by_nccl).ok());
    ASSERT_TRUE(Sample(inline_step, &by_inline).ok());
    by_nccl.clear_timing();
    by_inline.clear_timing();
    EXPECT_EQ(by_nccl.SerializeAsString(), by_inline.SerializeAsString()) << s;
  }
  // Malformed NCCL logits (a negative row count, a wrapping stride, no dtype): the step fails
  // INVALID_ARGUMENT naming the field, and the group fails (no receive can match the
  // follower's send any more); the server goes on.
  for (const auto& [rows, stride, dtype, needle] :
       std::vector<std::tuple<int, int64_t, v1::DType, std::string>>{
           {-1, 0, v1::FLOAT32, "logits.rows"},
           {3, int64_t{1} << 62, v1::FLOAT32, "logits"},
           {3, 0, v1::DTYPE_UNSPECIFIED, "logits.dtype"}}) {
    auto [bad_group, bad_followers] = ReadyGroup(2);
    v1::SampleRequest bad = SmallStep(20, 3, 80);
    bad.mutable_logits()->set_rows(rows);
    bad.mutable_logits()->set_row_stride(stride);
    bad.mutable_logits()->set_dtype(dtype);
    bad.mutable_logits()->mutable_nccl()->set_group_id(bad_group.group_id());
    bad.mutable_logits()->mutable_nccl()->set_src_rank(1);
    v1::SampleResponse response;
    const grpc::Status status = Sample(bad, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << needle;
    EXPECT_THAT(status.error_message(), HasSubstr(needle));
    EXPECT_EQ(State(bad_group.group_id()), v1::FAILED) << needle;
    EXPECT_TRUE(Sample(SmallStep(21, 2), &response).ok());
  }
  // A receive naming another group is refused; an unknown group is NOT_FOUND.
  v1::SampleRequest step = SmallStep(9, 2);
  step.mutable_logits()->mutable_nccl()->set_group_id("no-such-group");
  step.mutable_logits()->mutable_nccl()->set_src_rank(1);
  v1::SampleResponse response;
  const grpc::Status status = Sample(step, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("logits.nccl.group_id"));
}

TEST_F(GroupServiceTest, AFollowerDyingFailsItsGroupsStepsOnlyAndIsCounted) {
  auto [group, followers] = ReadyGroup(2, /*op_timeout_ms=*/200);
  followers[0]->Die();
  v1::SampleRequest request = SmallStep(5, 2);
  request.set_group_id(group.group_id());
  v1::SampleResponse response;
  const absl::Time start = absl::Now();
  grpc::Status status = Sample(request, &response);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr(group.group_id()));
  // Later steps naming it: FAILED_PRECONDITION. Steps without a group: served.
  status = Sample(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(Sample(SmallStep(6, 2), &response).ok());
  EXPECT_EQ(State(group.group_id()), v1::FAILED);
  EXPECT_EQ(groups_->failures(), 1);
  // Destroyed, and a new group works.
  {
    grpc::ClientContext context;
    v1::DestroyGroupRequest destroy;
    destroy.set_group_id(group.group_id());
    v1::DestroyGroupResponse destroyed;
    EXPECT_TRUE(stub_->DestroyGroup(&context, destroy, &destroyed).ok());
  }
  EXPECT_EQ(State(group.group_id()), v1::GROUP_STATE_UNSPECIFIED);
  auto [again, again_followers] = ReadyGroup(2);
  std::thread take([&, f = again_followers[0]] { EXPECT_TRUE(f->Receive(absl::Seconds(10)).ok()); });
  request.set_group_id(again.group_id());
  EXPECT_TRUE(Sample(request, &response).ok());
  take.join();
}

}  // namespace
}  // namespace samplerd
