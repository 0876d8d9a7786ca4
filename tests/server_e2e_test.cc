// samplerd end to end: the real server in its own process, real gRPC, real shared memory, the
// fake model worker as a third process.
//
//   server_e2e_test SAMPLERD FAKE_WORKER
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <cmath>
#include <random>
#include <set>
#include <thread>

#include "client/sampler_client.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/in_process.h"
#include "tests/server_process.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string g_samplerd;
std::string g_fake_worker;

class ServerE2E : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> flags = {}, const ClientOptions& options = {}) {
    server_ = std::make_unique<ServerProcess>(g_samplerd, std::move(flags));
    ASSERT_TRUE(server_->Start().ok());
    auto client = SamplerClient::Connect(server_->target(), options);
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }
  void TearDown() override {
    // Close our channel first: gRPC's sync server lingers ~5 s on shutdown while an idle
    // client connection stays open.
    client_.reset();
    if (server_) EXPECT_EQ(server_->Stop(SIGTERM), 0);
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<SamplerClient> client_;
};

TEST_F(ServerE2E, FakeModelWorkerAgreesBitwiseWithInProcessBackend) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  EXPECT_EQ(RunProcess({g_fake_worker, "--target=" + server_->target()}), 0);
}

TEST_F(ServerE2E, HealthAndServerInfo) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  auto serving = client_->IsServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  auto sampler = client_->IsServing("samplerd.v1.Sampler");
  ASSERT_TRUE(sampler.ok());
  EXPECT_TRUE(*sampler);
  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->backend(), "cpu");
  EXPECT_EQ(info->limits().max_top_logprobs(), 64);
  EXPECT_EQ(info->limits().max_request_memory_bytes(), int64_t{2} << 30);
  EXPECT_EQ(info->limits().draft_pool_ttl_ms(), 60000);
  EXPECT_GT(info->limits().draft_pool_bytes(), 325LL * 129280 * 4);
  // The CPU backend is no MPS client (issue 46), and a new GPU context cannot be had here.
  EXPECT_FALSE(info->mps());
  EXPECT_EQ(RunProcess({g_samplerd, "--probe_gpu_context"}), 1);
}

TEST_F(ServerE2E, DrainingReportsNotServingThenExitsZero) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--shutdown_grace_ms=1500"}));
  server_->Signal(SIGTERM);
  bool saw_not_serving = false;
  for (int i = 0; i < 100 && !saw_not_serving; ++i) {
    auto serving = client_->IsServing();
    saw_not_serving = serving.ok() && !*serving;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(saw_not_serving);
  EXPECT_EQ(server_->Wait(), 0);
  server_.reset();
}

TEST_F(ServerE2E, SigtermDuringAStreamAnswersEveryAcceptedStep) {
  // A client that does not wait for the next samplerd (one that does resends the refused
  // steps there: samplerd_restart_test).
  ClientOptions no_wait;
  no_wait.reconnect_timeout = std::chrono::milliseconds(0);
  ASSERT_NO_FATAL_FAILURE(StartServer({}, no_wait));
  auto stream = client_->OpenStream();
  ASSERT_TRUE(stream.ok());
  std::atomic<int> answered{0};
  std::vector<uint64_t> ids;
  absl::Status end;
  bool refused = false;
  std::thread worker([&] {
    for (uint64_t step = 0; step < 100000; ++step) {
      auto response = (*stream)->Step(SmallStep(step, 2, 2000, step));
      if (!response.ok()) {
        end = response.status();
        return;
      }
      if (response->has_error()) {
        // A step read after the drain began is refused, with a response of its own.
        refused = response->error().code() == static_cast<int>(absl::StatusCode::kUnavailable);
        end = absl::Status(static_cast<absl::StatusCode>(response->error().code()),
                           response->error().message());
        auto after = (*stream)->Receive();  // the stream then ends
        if (!after.ok()) end = after.status();
        return;
      }
      ids.push_back(response->step_id());
      ++answered;
    }
  });
  while (answered.load() < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int exit_code = server_->Stop(SIGTERM);
  server_.reset();
  worker.join();
  EXPECT_EQ(exit_code, 0);
  // Every step the server read was answered, in order (at most the last refused as
  // UNAVAILABLE because it arrived after the drain began); the stream then ended UNAVAILABLE.
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], i);
  if (refused) EXPECT_THAT(std::string(end.message()), HasSubstr("shutting down"));
  EXPECT_GE(ids.size(), 20u);
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
}

TEST_F(ServerE2E, StepFaultsMapToCodesNamingTheField) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  {
    v1::SampleRequest bad = SmallStep(1);
    bad.mutable_logits()->set_rows(0);
    auto r = client_->Sample(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("logits.rows"));
  }
  {
    v1::SampleRequest bad = SmallStep(1);
    bad.mutable_logits()->mutable_buffer()->set_name("nope");
    bad.mutable_logits()->set_dtype(v1::FLOAT32);
    auto r = client_->Sample(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("logits.buffer.name"));
  }
  {
    auto shm = ShmBuffer::Create("/samplerd-e2e-slice-" + std::to_string(getpid()), 1024);
    ASSERT_TRUE(shm.ok());
    ASSERT_TRUE(client_->RegisterShm("small", **shm).ok());
    v1::SampleRequest bad = SmallStep(1);  // 3 x 64 floats = 768 bytes
    bad.mutable_logits()->mutable_buffer()->set_name("small");
    bad.mutable_logits()->mutable_buffer()->set_byte_offset(512);
    bad.mutable_logits()->set_dtype(v1::FLOAT32);
    auto r = client_->Sample(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("logits.buffer.byte_offset"));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("exceeds buffer 'small' of 1024"));
    bad.mutable_logits()->mutable_buffer()->set_byte_offset(-4);
    EXPECT_EQ(client_->Sample(bad).status().code(), absl::StatusCode::kInvalidArgument);
    bad.mutable_logits()->mutable_buffer()->set_byte_offset(256);  // [256, 1024): fits
    EXPECT_TRUE(client_->Sample(bad).ok());
  }
  {
    v1::RegisterBufferRequest reg;
    reg.set_name("gpu");
    reg.set_kind(v1::CUDA_IPC);
    reg.set_byte_size(4096);
    reg.set_cuda_ipc_handle(std::string(10, 'x'));
    absl::Status s = client_->RegisterBuffer(reg);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("cuda_ipc_handle: 10 bytes"));
    reg.set_cuda_ipc_handle(std::string(64, 'x'));
    EXPECT_EQ(client_->RegisterBuffer(reg).code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    v1::SampleRequest bad = SmallStep(1);
    bad.mutable_logits()->mutable_cuda_ipc()->set_handle(std::string(63, 'h'));
    bad.mutable_logits()->set_dtype(v1::FLOAT32);
    auto r = client_->Sample(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("logits.cuda_ipc.handle"));
  }
  {
    v1::SampleRequest bad = SmallStep(1);
    bad.mutable_inputs()->set_kind(v1::STEP_KIND_UNSPECIFIED);
    EXPECT_THAT(std::string(client_->Sample(bad).status().message()), HasSubstr("inputs.kind"));
  }
  {
    grpc::ClientContext context;
    auto stub = v1::Sampler::NewStub(
        grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
    v1::CreateGroupResponse response;
    // Groups need NCCL, i.e. the CUDA backend (tests/group_service_test covers them).
    const grpc::Status status = stub->CreateGroup(&context, v1::CreateGroupRequest(), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("CUDA backend"));
  }
}

TEST_F(ServerE2E, OversizeMessageIsResourceExhausted) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_bytes=1048576"}));
  v1::SampleRequest big = SmallStep(1, 1, 64);
  big.mutable_logits()->set_cols(300000);
  big.mutable_logits()->mutable_values()->mutable_values()->Resize(300000, 0.5f);
  auto r = client_->Sample(big);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
}

TEST_F(ServerE2E, PerRequestFaultsLeaveOtherResultsIntact) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  v1::SampleRequest step = SmallStep(7, 4);
  step.mutable_inputs()->mutable_requests(1)->mutable_params()->set_top_p(0.0f);
  step.mutable_inputs()->mutable_requests(2)->add_output_token_ids(64);
  auto got = client_->Sample(step);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->results(1).status().code(), 3);
  EXPECT_THAT(got->results(1).status().message(), HasSubstr("requests[1].params.top_p"));
  EXPECT_THAT(got->results(2).status().message(), HasSubstr("output_token_ids[0]"));
  // Requests 0 and 3 are answered as when alone.
  for (int i : {0, 3}) {
    v1::SampleRequest alone = SmallStep(7, 4);
    auto* requests = alone.mutable_inputs()->mutable_requests();
    v1::RequestInputs keep = requests->Get(i);
    requests->Clear();
    *requests->Add() = keep;
    auto single = client_->Sample(alone);
    ASSERT_TRUE(single.ok());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(single->results(0),
                                                                   got->results(i)));
  }
}

// SPEC 3 step 2's token adjustments through gRPC: each one's effect on the processed
// distribution (the whole of it, as top logprobs), a fault naming its field, and the same
// answers as the in-process backend.
TEST_F(ServerE2E, TokenAdjustmentsThroughGrpc) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  auto info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->limits().max_token_list(), 16384);
  EXPECT_THAT(info->features(), ::testing::Contains("token_adjustments"));
  EXPECT_THAT(info->features(), ::testing::IsSupersetOf({"request_batch", "packed_results"}));
  EXPECT_THAT(info->features(), ::testing::Not(::testing::Contains("step_output")));  // CPU
  EXPECT_THAT(info->features(), ::testing::Not(::testing::Contains("device_drafts")));
  EXPECT_THAT(info->features(), ::testing::Contains("top_n_sigma"));
  EXPECT_THAT(info->features(), ::testing::Contains("xtc"));
  EXPECT_THAT(info->features(), ::testing::Contains("raw_logprobs"));

  v1::SampleRequest step = SmallStep(11, 4);
  auto* requests = step.mutable_inputs()->mutable_requests();
  for (v1::RequestInputs& r : *requests) r.mutable_params()->set_top_logprobs(64);
  v1::SamplingParams* allowed = requests->Mutable(0)->mutable_params();
  for (int t : {3, 9, 40}) allowed->add_allowed_token_ids(t);
  (*requests->Mutable(1)->mutable_params()->mutable_logit_bias())[5] = 100.0f;
  v1::RequestInputs* banned = requests->Mutable(2);
  banned->add_output_token_ids(1);
  banned->mutable_params()->add_bad_words()->add_token_ids(7);
  v1::TokenSequence* pair = banned->mutable_params()->add_bad_words();
  pair->add_token_ids(1);
  pair->add_token_ids(12);  // the history ends with 1: 12 is banned too
  banned->mutable_params()->set_min_tokens(3);
  banned->mutable_params()->add_stop_token_ids(8);
  (*requests->Mutable(3)->mutable_params()->mutable_logit_bias())[6] = 150.0f;

  auto got = client_->Sample(step);
  ASSERT_TRUE(got.ok()) << got.status();
  auto finite_tokens = [](const v1::RequestResult& r) {
    std::set<int> out;
    const v1::TopLogprobs& top = r.top_logprobs(0);
    for (int i = 0; i < top.token_ids_size(); ++i) {
      if (top.token_ids(i) >= 0 && std::isfinite(top.logprobs(i))) out.insert(top.token_ids(i));
    }
    return out;
  };
  ASSERT_FALSE(got->results(0).has_status()) << got->results(0).status().message();
  EXPECT_EQ(finite_tokens(got->results(0)), (std::set<int>{3, 9, 40}));
  EXPECT_EQ(got->results(1).token_ids(0), 5);
  const std::set<int> left = finite_tokens(got->results(2));
  EXPECT_EQ(left.size(), 61u);  // 64 less 7, 12 and 8
  for (int t : {7, 8, 12}) EXPECT_EQ(left.count(t), 0u) << t;
  EXPECT_EQ(got->results(3).status().code(), 3);
  EXPECT_THAT(got->results(3).status().message(), HasSubstr("requests[3].params.logit_bias[6]"));

  auto backend = CpuBackend::Create({});
  ASSERT_TRUE(backend.ok());
  auto want = RunInProcess(**backend, step);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(want->results(i), got->results(i)))
        << i;
  }
}

TEST_F(ServerE2E, StreamAnswersAFailedStepAndGoesOn) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  auto stream = client_->OpenStream();
  ASSERT_TRUE(stream.ok());
  v1::SampleRequest bad = SmallStep(1);
  bad.mutable_inputs()->set_vocab_size(1000);
  auto first = (*stream)->Step(bad);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->step_id(), 1u);
  EXPECT_EQ(first->error().code(), 3);
  EXPECT_THAT(first->error().message(), HasSubstr("inputs.vocab_size"));
  auto second = (*stream)->Step(SmallStep(2));
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->has_error());
  EXPECT_EQ(second->results_size(), 3);
  EXPECT_TRUE((*stream)->Close().ok());
}

// The co-located step channel (C++ client): the stream's answers, bitwise (timings aside), a
// step-level fault answered in place, the channel going on, and a request over its capacity
// refused by the client.
TEST_F(ServerE2E, StepChannelAnswersAsTheStream) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  auto stream = client_->OpenStream();
  ASSERT_TRUE(stream.ok());
  auto channel = client_->OpenChannel(/*capacity_bytes=*/1 << 16);
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (uint64_t id = 1; id <= 20; ++id) {
    v1::SampleRequest step = SmallStep(id, 1 + static_cast<int>(id % 4));
    if (id % 5 == 0) step.mutable_inputs()->mutable_requests(0)->mutable_params()->set_top_p(0.0f);
    auto want = (*stream)->Step(step);
    auto got = (*channel)->Step(step);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    EXPECT_EQ(got->step_id(), id);
    ASSERT_EQ(got->results_size(), want->results_size());
    for (int i = 0; i < got->results_size(); ++i) {
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(want->results(i),
                                                                     got->results(i)))
          << "step " << id << " request " << i;
    }
  }
  v1::SampleRequest bad = SmallStep(30);
  bad.mutable_inputs()->set_vocab_size(1000);
  auto refused = (*channel)->Step(bad);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->error().code(), 3);
  EXPECT_THAT(refused->error().message(), HasSubstr("inputs.vocab_size"));
  v1::SampleRequest big = SmallStep(31);
  big.mutable_logits()->set_data(std::string(1 << 17, '\0'));
  EXPECT_EQ((*channel)->Step(big).status().code(), absl::StatusCode::kInvalidArgument);
  auto after = (*channel)->Step(SmallStep(32));
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_error());
  (*channel)->Close();
  EXPECT_EQ((*channel)->Step(SmallStep(33)).status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE((*stream)->Close().ok());
}

TEST_F(ServerE2E, BufferLifecycle) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  auto shm = ShmBuffer::Create("/samplerd-e2e-life-" + std::to_string(getpid()), 4096);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(client_->RegisterShm("logits", **shm).ok());
  EXPECT_TRUE((*shm)->unlinked());  // samplerd has it: the name is gone from /dev/shm
  // A second object (RegisterShm unlinked the first one's name) under the same name: another
  // client may not take it (whose it is stays unsaid); the same client replaces its own region
  // (issue 45: a worker restarted under a stable client_id takes over its names at once).
  auto other = ShmBuffer::Create("/samplerd-e2e-life2-" + std::to_string(getpid()), 4096);
  ASSERT_TRUE(other.ok());
  auto connected = SamplerClient::Connect(server_->target());
  ASSERT_TRUE(connected.ok());
  std::unique_ptr<SamplerClient>& stranger = *connected;
  const absl::Status taken = stranger->RegisterShm("logits", **other);
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(taken.message()), HasSubstr("by another client"));
  EXPECT_THAT(std::string(taken.message()), Not(HasSubstr(client_->client_id())));
  auto third = ShmBuffer::Create("/samplerd-e2e-life3-" + std::to_string(getpid()), 4096);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(client_->RegisterShm("logits", **third).ok());
  auto list = client_->ListBuffers();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->buffers_size(), 1);
  EXPECT_EQ(list->buffers(0).name(), "logits");
  EXPECT_EQ(list->buffers(0).byte_size(), 4096);
  EXPECT_EQ(list->buffers(0).in_use(), 0);
  EXPECT_EQ(list->buffers(0).owner(),
            absl::StrCat("uid:", geteuid(), "/id:", client_->client_id()));
  // Another client sees none of it, and can neither read nor remove it.
  auto theirs = stranger->ListBuffers();
  ASSERT_TRUE(theirs.ok());
  EXPECT_EQ(theirs->buffers_size(), 0);
  EXPECT_EQ(stranger->UnregisterBuffer("logits").code(), absl::StatusCode::kNotFound);
  v1::SampleRequest borrowed = SmallStep(2);
  borrowed.mutable_logits()->clear_values();
  borrowed.mutable_logits()->mutable_buffer()->set_name("logits");
  borrowed.mutable_logits()->set_dtype(v1::FLOAT32);
  EXPECT_EQ(stranger->Sample(borrowed).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client_->Sample(borrowed).ok());
  v1::RegisterBufferRequest missing;
  missing.set_name("missing");
  missing.set_kind(v1::HOST_SHM);
  missing.set_shm_name("/samplerd-no-such-object");
  missing.set_byte_size(16);
  EXPECT_EQ(client_->RegisterBuffer(missing).code(), absl::StatusCode::kNotFound);
  v1::RegisterBufferRequest too_big;
  too_big.set_name("big");
  too_big.set_kind(v1::HOST_SHM);
  too_big.set_shm_name((*other)->shm_name());
  too_big.set_byte_size(8192);
  EXPECT_EQ(client_->RegisterBuffer(too_big).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client_->UnregisterBuffer("logits").ok());
  EXPECT_EQ(client_->UnregisterBuffer("logits").code(), absl::StatusCode::kNotFound);
  v1::SampleRequest step = SmallStep(1);
  step.mutable_logits()->mutable_buffer()->set_name("logits");
  step.mutable_logits()->set_dtype(v1::FLOAT32);
  EXPECT_EQ(client_->Sample(step).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServerE2E, ManyConcurrentClientsGetExactAnswers) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_queued_steps=256"}));
  constexpr int kClients = 8, kSteps = 25;
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0}, failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = SamplerClient::Connect(server_->target());
      auto local = CpuBackend::Create({.num_threads = 1});
      if (!client.ok() || !local.ok()) {
        ++failures;
        return;
      }
      for (int s = 0; s < kSteps; ++s) {
        const v1::SampleRequest request = SmallStep(s, 4, 500, 1000 * c + s);
        auto got = (*client)->Sample(request);
        auto want = RunInProcess(**local, request);
        if (!got.ok() || !want.ok()) {
          ++failures;
          continue;
        }
        got->clear_timing();
        if (!google::protobuf::util::MessageDifferencer::Equals(*got, *want)) ++mismatches;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(ServerE2E, BusyServerAnswersResourceExhaustedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_queued_steps=1", "--threads=1"}));
  // Two streams of slow steps: with one admission slot, some steps must be refused.
  std::atomic<int> refused{0}, answered{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&, c] {
      auto client = SamplerClient::Connect(server_->target());
      for (int s = 0; s < 10; ++s) {
        auto got = (*client)->Sample(SmallStep(s, 8, 60000, 10 * c + s));
        if (got.ok()) {
          ++answered;
        } else if (got.status().code() == absl::StatusCode::kResourceExhausted) {
          EXPECT_THAT(std::string(got.status().message()), HasSubstr("busy"));
          ++refused;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(refused.load(), 0);
  EXPECT_GT(answered.load(), 0);
  EXPECT_EQ(refused.load() + answered.load(), 40);
}

TEST_F(ServerE2E, PrometheusMetricsCountSteps) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--metrics_address=127.0.0.1:0"}));
  ASSERT_GT(server_->metrics_port(), 0);
  ASSERT_TRUE(client_->Sample(SmallStep(1)).ok());
  v1::SampleRequest bad = SmallStep(2);
  bad.mutable_inputs()->mutable_requests(0)->mutable_params()->set_top_k(0);
  ASSERT_TRUE(client_->Sample(bad).ok());
  const std::string metrics = HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("samplerd_step_seconds_count{kind=\"PREFILL\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("samplerd_requests_total{kind=\"PREFILL\"} 6"));
  // Rows read: 3 in the first step, 2 in the second (its bad request reads none).
  EXPECT_THAT(metrics, HasSubstr("samplerd_rows_total{kind=\"PREFILL\"} 5"));
  EXPECT_THAT(metrics, HasSubstr("samplerd_errors_total{code=\"INVALID_ARGUMENT\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("samplerd_steps_in_flight 0"));
  EXPECT_EQ(MetricValue(metrics, "samplerd_mps_client"), 0);  // the CPU backend (issue 46)
}

TEST_F(ServerE2E, ListensOnAUnixSocket) {
  char dir_template[] = "/tmp/samplerd-sock-XXXXXX";
  const std::string socket = std::string(mkdtemp(dir_template)) + "/samplerd.sock";
  ASSERT_NO_FATAL_FAILURE(StartServer({"--unix_socket=" + socket}));
  auto client = SamplerClient::Connect("unix:" + socket);
  ASSERT_TRUE(client.ok());
  auto response = (*client)->Sample(SmallStep(5));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->results_size(), 3);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: server_e2e_test SAMPLERD FAKE_WORKER\n");
    return 2;
  }
  samplerd::g_samplerd = argv[1];
  samplerd::g_fake_worker = argv[2];
  return RUN_ALL_TESTS();
}
