// The cost of a context-parallel group per step (two GPUs: scripts/gpu_multi.sh). samplerd
// runs the CUDA backend on GPU 0; a follower process (tests:group_follower) is rank 1 on GPU 1.
// For R = 16 and 384 PREFILL requests over V = 129,280 fp32 logits in a registered CUDA IPC
// region, the same steps are timed without a group and with one (results broadcast to the
// follower): client latency p50/p99, the server's group time (StepTiming.group_us: the
// broadcast, waiting included) and the ratio with/without, all measured in this run.
//   group_bench SAMPLERD GROUP_FOLLOWER [--steps=300]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/device_logits.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "tests/server_process.h"

namespace samplerd {
namespace {

constexpr int kVocab = 129280;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

v1::SampleRequest Step(uint64_t id, int rows, const std::string& group) {
  v1::SampleRequest request;
  request.set_step_id(id);
  request.set_group_id(group);
  v1::Tensor* logits = request.mutable_logits();
  logits->set_dtype(v1::FLOAT32);
  logits->set_rows(rows);
  logits->set_cols(kVocab);
  logits->mutable_buffer()->set_name("bench-logits");
  v1::SamplerInputs* in = request.mutable_inputs();
  in->set_kind(v1::PREFILL);
  in->set_vocab_size(kVocab);
  for (int r = 0; r < rows; ++r) {
    v1::RequestInputs* q = in->add_requests();
    q->set_request_id(absl::StrCat("r", r));
    q->set_row(r);
    q->set_sample_position(static_cast<int64_t>(id));
    q->mutable_params()->set_temperature(0.7f);
    q->mutable_params()->set_top_p(0.95f);
    q->mutable_params()->set_top_k(50);
    q->mutable_params()->set_top_logprobs(5);
    q->mutable_params()->set_seq_seed(id * 1000 + r);
  }
  return request;
}

struct Figures {
  double p50_us, p99_us, group_p50_us;
};

Figures Run(v1::Sampler::Stub& stub, int rows, const std::string& group, int steps) {
  std::vector<double> latency, group_us;
  for (int s = 0; s < steps + 20; ++s) {
    const v1::SampleRequest request = Step(s, rows, group);
    v1::SampleResponse response;
    grpc::ClientContext context;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = stub.Sample(&context, request, &response);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok()) {
      std::fprintf(stderr, "group_bench: step failed: %s\n", status.error_message().c_str());
      std::exit(1);
    }
    if (s < 20) continue;  // warm-up
    latency.push_back(us);
    group_us.push_back(static_cast<double>(response.timing().group_us()));
  }
  return {Percentile(latency, 0.5), Percentile(latency, 0.99), Percentile(group_us, 0.5)};
}

int Main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: group_bench SAMPLERD GROUP_FOLLOWER [--steps=N]\n");
    return 2;
  }
  int steps = 300;
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]).rfind("--steps=", 0) == 0) steps = std::atoi(argv[i] + 8);
  }
  ServerProcess server(argv[1], {"--backend=cuda", "--cuda_device=0"});
  if (!server.Start().ok()) return 1;
  auto stub = v1::Sampler::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  // Logits for the largest step in GPU memory, registered once.
  std::vector<float> host(static_cast<size_t>(384) * kVocab);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& x : host) x = normal(rng);
  auto logits = DeviceLogits::Create(host.data(), host.size() * 4, 0);
  if (!logits.ok()) return 1;
  {
    grpc::ClientContext context;
    v1::RegisterBufferResponse registered;
    if (!stub->RegisterBuffer(&context, (*logits)->RegisterRequest("bench-logits"), &registered).ok()) return 1;
  }
  v1::CreateGroupRequest create;
  create.set_world_size(2);
  create.set_max_step_tokens(384);
  create.set_op_timeout_ms(10000);
  v1::CreateGroupResponse group;
  {
    grpc::ClientContext context;
    if (!stub->CreateGroup(&context, create, &group).ok()) return 1;
  }
  const std::string hex = absl::BytesToHexString(group.nccl_unique_id());
  const pid_t follower =
      SpawnProcess({argv[2], "--unique_id_hex=" + hex, "--world_size=2", "--rank=1", "--device=1",
                    "--max_step_tokens=384", "--out=/dev/null"});
  for (int i = 0; i < 60000; ++i) {
    grpc::ClientContext context;
    v1::GetServerInfoResponse info;
    stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (info.groups_size() == 1 && info.groups(0).state() == v1::READY) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::printf("| R | without group p50 / p99 us | with group p50 / p99 us | broadcast (group_us) p50 us | p50 ratio |\n|---|---|---|---|---|\n");
  for (int rows : {16, 384}) {
    const Figures plain = Run(*stub, rows, "", steps);
    const Figures grouped = Run(*stub, rows, group.group_id(), steps);
    std::printf("| %d | %.0f / %.0f | %.0f / %.0f | %.0f | %.3f |\n", rows, plain.p50_us, plain.p99_us,
                grouped.p50_us, grouped.p99_us, grouped.group_p50_us, grouped.p50_us / plain.p50_us);
  }
  {
    grpc::ClientContext context;
    v1::DestroyGroupRequest destroy;
    destroy.set_group_id(group.group_id());
    v1::DestroyGroupResponse destroyed;
    stub->DestroyGroup(&context, destroy, &destroyed);
  }
  int status = 0;
  waitpid(follower, &status, 0);
  return server.Stop(SIGTERM);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) { return samplerd::Main(argc, argv); }
