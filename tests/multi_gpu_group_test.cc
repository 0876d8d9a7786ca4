// Context-parallel groups on two GPUs (tags gpu, multi_gpu; nvidia-h200-x2): samplerd is rank 0
// on GPU 0, a follower process (group_follower, the C++ follower library) rank 1 on GPU 1.
//   - 1000 steps whose broadcast packets equal the gRPC answers bitwise;
//   - logits sent by the follower over NCCL, sampled exactly like the same logits inline;
//   - kill -9 of the follower while a step waits on it: the step fails UNAVAILABLE within the
//     group's deadline, other clients are answered meanwhile, the group turns FAILED;
//   - DestroyGroup, then a new group and follower work.
//   multi_gpu_group_test SAMPLERD GROUP_FOLLOWER
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <atomic>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "tests/group_rpc.h"
#include "tests/group_steps.h"
#include "tests/server_process.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

std::string g_samplerd, g_follower;

// The follower process.
class Follower {
 public:
  Follower(const v1::CreateGroupResponse& group, int max_step_tokens,
           std::vector<std::string> extra) {
    char dir[] = "/tmp/samplerd-follower-XXXXXX";
    out_ = std::string(mkdtemp(dir)) + "/packets.txt";
    std::vector<std::string> args = {
        g_follower, "--unique_id_hex=" + absl::BytesToHexString(group.nccl_unique_id()),
        "--world_size=2", "--rank=1", "--device=1",
        absl::StrCat("--max_step_tokens=", max_step_tokens), "--out=" + out_};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = SpawnProcess(std::move(args));
  }
  ~Follower() {
    if (pid_ > 0) Kill();
  }
  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::vector<std::string> Lines() const {
    std::ifstream in(out_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

 private:
  pid_t pid_ = -1;
  std::string out_;
};

class MultiGpuGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(
        g_samplerd, std::vector<std::string>{"--backend=cuda", "--cuda_device=0"});
    ASSERT_TRUE(server_->Start().ok());
    stub_ = v1::Sampler::NewStub(
        grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
  }

  v1::CreateGroupResponse Create(int max_step_tokens, int op_timeout_ms, int64_t logits_bytes) {
    v1::CreateGroupRequest request;
    request.set_world_size(2);
    request.set_max_step_tokens(max_step_tokens);
    request.set_device_id(0);
    request.set_join_timeout_ms(60000);
    request.set_op_timeout_ms(op_timeout_ms);
    request.set_max_logits_bytes(logits_bytes);
    v1::CreateGroupResponse created;
    grpc::ClientContext context;
    const grpc::Status status = stub_->CreateGroup(&context, request, &created);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return created;
  }

  v1::GroupState WaitReady(const std::string& id) {
    for (int i = 0; i < 60000; ++i) {
      const v1::GroupState state = State(id);
      if (state != v1::JOINING) return state;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return v1::JOINING;
  }

  v1::GroupState State(const std::string& id) { return GroupStateOf(*stub_, id); }

  grpc::Status Sample(const v1::SampleRequest& request, v1::SampleResponse* response) {
    return SampleOnce(*stub_, request, response);
  }

  grpc::Status Destroy(const std::string& id) {
    v1::DestroyGroupRequest request;
    request.set_group_id(id);
    v1::DestroyGroupResponse response;
    grpc::ClientContext context;
    return stub_->DestroyGroup(&context, request, &response);
  }

  static std::string ResponseLine(const v1::SampleResponse& response) {
    GroupPacket packet;
    packet.step_id = response.step_id();
    for (const v1::RequestResult& r : response.results()) {
      PacketRequest p;
      p.status_code = r.status().code();
      if (p.status_code == 0) {
        p.num_accepted = r.num_accepted();
        p.token_ids.assign(r.token_ids().begin(), r.token_ids().end());
      }
      packet.requests.push_back(p);
    }
    return PacketLine(packet);
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

TEST_F(MultiGpuGroupTest, AThousandBroadcastsEqualTheGrpcAnswersBitwise) {
  const v1::CreateGroupResponse group = Create(4096, 10000, 0);
  Follower follower(group, 4096, {});
  ASSERT_EQ(WaitReady(group.group_id()), v1::READY);
  std::vector<std::string> want;
  for (int s = 0; s < 1000; ++s) {
    v1::SampleRequest request = SmallStep(s, /*n=*/16, /*vocab=*/2048, /*seed=*/s + 1);
    request.set_group_id(group.group_id());
    v1::SampleResponse response;
    ASSERT_TRUE(Sample(request, &response).ok()) << s;
    want.push_back(ResponseLine(response));
  }
  ASSERT_TRUE(Destroy(group.group_id()).ok());  // the follower gets the closing packet
  EXPECT_EQ(follower.Wait(), 0);
  std::vector<std::string> got = follower.Lines();
  ASSERT_EQ(got.size(), want.size() + 1);
  EXPECT_EQ(got.back(), "closed");
  got.pop_back();
  int differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += got[i] != want[i];
  EXPECT_EQ(differ, 0) << "first: " << got[0] << " vs " << want[0];
}

TEST_F(MultiGpuGroupTest, NcclLogitsFromTheFollowerAreSampledLikeTheSameLogitsInline) {
  constexpr int kRows = 8, kCols = 32000, kSteps = 50;
  const v1::CreateGroupResponse group = Create(1024, 10000, int64_t{kRows} * kCols * 4);
  Follower follower(group, 1024,
                    {absl::StrCat("--logits_rows=", kRows), absl::StrCat("--logits_cols=", kCols),
                     absl::StrCat("--steps=", kSteps)});
  ASSERT_EQ(WaitReady(group.group_id()), v1::READY);
  for (int s = 0; s < kSteps; ++s) {
    v1::SampleRequest inline_step = SmallStep(s, kRows, kCols, /*seed=*/s + 5);
    const std::vector<float> logits = FollowerLogits(s, kRows, kCols);
    inline_step.mutable_logits()->mutable_values()->mutable_values()->Assign(logits.begin(),
                                                                              logits.end());
    v1::SampleRequest nccl_step = inline_step;
    nccl_step.set_group_id(group.group_id());
    nccl_step.mutable_logits()->set_dtype(v1::FLOAT32);
    nccl_step.mutable_logits()->mutable_nccl()->set_group_id(group.group_id());
    nccl_step.mutable_logits()->mutable_nccl()->set_src_rank(1);
    v1::SampleResponse by_nccl, by_inline;
    ASSERT_TRUE(Sample(nccl_step, &by_nccl).ok()) << s;
    ASSERT_TRUE(Sample(inline_step, &by_inline).ok()) << s;
    by_nccl.clear_timing();
    by_inline.clear_timing();
    EXPECT_EQ(by_nccl.SerializeAsString(), by_inline.SerializeAsString()) << s;
  }
  EXPECT_EQ(follower.Wait(), 0);
  EXPECT_EQ(follower.Lines().size(), static_cast<size_t>(kSteps));
}

TEST_F(MultiGpuGroupTest, AKilledFollowerIsAbortedWithinTheDeadlineAndOthersAreServed) {
  constexpr int kOpTimeoutMs = 2000;
  const v1::CreateGroupResponse group = Create(1024, kOpTimeoutMs, 0);
  {
    Follower follower(group, 1024, {"--stall_after=5"});
    ASSERT_EQ(WaitReady(group.group_id()), v1::READY);
    for (int s = 0; s < 5; ++s) {
      v1::SampleRequest request = SmallStep(s, 4, 1024, s + 1);
      request.set_group_id(group.group_id());
      v1::SampleResponse response;
      ASSERT_TRUE(Sample(request, &response).ok());
    }
    // The follower stops taking packets after step 5, and is killed 300 ms later. NCCL may
    // buffer a few small broadcasts in the peer's FIFO, so the driver keeps stepping: some
    // step must fail UNAVAILABLE naming the group within the group's deadline of the kill.
    std::atomic<bool> killed{false};
    std::atomic<int64_t> killed_at_ms{0};
    grpc::Status failure;
    int64_t failed_at_ms = 0;
    auto now_ms = [] { return absl::ToUnixMillis(absl::Now()); };
    std::thread driver([&] {
      for (int s = 5; s < 100000; ++s) {
        v1::SampleRequest request = SmallStep(s, 4, 1024, s + 1);
        request.set_group_id(group.group_id());
        v1::SampleResponse response;
        const grpc::Status status = Sample(request, &response);
        if (!status.ok()) {
          failure = status;
          failed_at_ms = now_ms();
          return;
        }
        if (killed && now_ms() - killed_at_ms > kOpTimeoutMs + 10000) return;  // never failed
      }
    });
    absl::SleepFor(absl::Milliseconds(300));
    follower.Kill();
    killed_at_ms = now_ms();
    killed = true;
    // Another client, no group: answered while the group's steps hang.
    v1::SampleResponse other;
    EXPECT_TRUE(Sample(SmallStep(99, 4, 1024, 9), &other).ok());
    driver.join();
    std::printf("killed follower: a step failed %lld ms after the kill (op_timeout %d ms): %s\n",
                static_cast<long long>(failed_at_ms - killed_at_ms), kOpTimeoutMs,
                failure.error_message().c_str());
    EXPECT_EQ(failure.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(failure.error_message(), HasSubstr(group.group_id()));
    EXPECT_LT(failed_at_ms - killed_at_ms, kOpTimeoutMs + 3000);
  }
  EXPECT_EQ(State(group.group_id()), v1::FAILED);
  v1::SampleRequest later = SmallStep(6, 4, 1024, 7);
  later.set_group_id(group.group_id());
  v1::SampleResponse response;
  EXPECT_EQ(Sample(later, &response).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Destroy it; a new group with a new follower works.
  ASSERT_TRUE(Destroy(group.group_id()).ok());
  const v1::CreateGroupResponse again = Create(1024, 10000, 0);
  Follower follower(again, 1024, {});
  ASSERT_EQ(WaitReady(again.group_id()), v1::READY);
  for (int s = 0; s < 10; ++s) {
    v1::SampleRequest request = SmallStep(s, 4, 1024, s + 1);
    request.set_group_id(again.group_id());
    ASSERT_TRUE(Sample(request, &response).ok());
  }
  ASSERT_TRUE(Destroy(again.group_id()).ok());
  EXPECT_EQ(follower.Wait(), 0);
  EXPECT_EQ(follower.Lines().size(), 11u);  // 10 steps and "closed"
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: multi_gpu_group_test SAMPLERD GROUP_FOLLOWER\n");
    return 2;
  }
  samplerd::g_samplerd = argv[1];
  samplerd::g_follower = argv[2];
  return RUN_ALL_TESTS();
}
