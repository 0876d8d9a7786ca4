// Issue 26, the other way round: samplerd restarts (SIGKILL, then started again on the same
// socket, as a sidecar restart would) under a live worker's decode loop. The loop is this
// test's, written as a worker would write it, with no code for restarts: a SampleStream of
// steps over a registered shm region. samplerd is restarted six ways: killed before a step,
// during one, between steps long enough for the keep-alive to notice, with four steps
// pipelined, and before a unary Sample; and drained (SIGTERM, a rollout) with steps sent after
// the drain began. Every answer must equal the CPU backend's in this process on an
// inline copy of the same logits (bitwise), the region must be registered with the new
// samplerd under this client, and /dev/shm must hold no name of it.
//
//   samplerd_restart_test SAMPLERD
#include <gtest/gtest.h>
#include <google/protobuf/util/message_differencer.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/sampler_client.h"
#include "client/shm_buffer.h"
#include "sampler/cpu_backend.h"
#include "tests/in_process.h"
#include "tests/server_process.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

std::string g_samplerd;
// Where the test is, for the watchdog: a stream read has no deadline, so a hang would
// otherwise surface only as the test runner's timeout, without a clue.
std::atomic<const char*> g_phase{"start"};
constexpr int kRows = 4;
constexpr int kVocab = 4096;
constexpr int kSlots = 4;  // pipelined steps read different slots of the region
constexpr int64_t kSlotBytes = int64_t{kRows} * kVocab * 4;

// Step `s`'s logits into slot s % kSlots of `shm`, and the request that reads them there
// (`inline_copy`: the same step with the logits inline, for the reference).
v1::SampleRequest MakeStep(int s, ShmBuffer& shm, v1::SampleRequest* inline_copy) {
  *inline_copy = SmallStep(s + 1, kRows, kVocab, /*seed=*/1000 + s);
  for (v1::RequestInputs& q : *inline_copy->mutable_inputs()->mutable_requests()) {
    q.mutable_params()->set_temperature(0.9f);
    q.mutable_params()->set_top_p(0.95f);
    q.mutable_params()->set_top_logprobs(3);
  }
  // The same step reading its logits from slot s % kSlots of the region.
  v1::SampleRequest request = *inline_copy;
  const auto& values = inline_copy->logits().values().values();
  std::copy(values.begin(), values.end(),
            reinterpret_cast<float*>(static_cast<char*>(shm.data()) + (s % kSlots) * kSlotBytes));
  v1::Tensor* t = request.mutable_logits();
  t->clear_values();
  t->set_dtype(v1::FLOAT32);
  t->mutable_buffer()->set_name("decode-logits");
  t->mutable_buffer()->set_byte_offset((s % kSlots) * kSlotBytes);
  return request;
}

int ShmEntries(const std::string& prefix) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    n += absl::StartsWith(entry.path().filename().string(), prefix);
  }
  return n;
}

bool Maps(pid_t pid, const std::string& shm_name) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (absl::StrContains(line, "/dev/shm" + shm_name)) return true;
  }
  return false;
}

class Reference {
 public:
  Reference() : backend_(std::move(*CpuBackend::Create({.num_threads = 1}))) {}
  // Whether `got` is what the CPU backend answers for `inline_copy`.
  ::testing::AssertionResult Agrees(const v1::SampleRequest& inline_copy, v1::SampleResponse got) {
    auto want = RunInProcess(*backend_, inline_copy);
    if (!want.ok()) return ::testing::AssertionFailure() << want.status();
    got.clear_timing();
    if (google::protobuf::util::MessageDifferencer::Equals(got, *want)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "step " << inline_copy.step_id() << ": got "
                                         << got.ShortDebugString() << "\nwant "
                                         << want->ShortDebugString();
  }

 private:
  std::unique_ptr<CpuBackend> backend_;
};

// What a worker's decode loop starts from: a client of `server` (its unix socket) that waits
// up to 20 s for samplerd to come back, a region /`prefix` of kSlots steps registered as
// "decode-logits", and a SampleStream open.
struct DecodeWorker {
  std::unique_ptr<SamplerClient> client;
  std::unique_ptr<ShmBuffer> shm;
  std::unique_ptr<SamplerClient::StepStream> stream;
};

absl::StatusOr<DecodeWorker> StartDecodeWorker(ServerProcess& server, const std::string& prefix) {
  ClientOptions options;
  options.reconnect_timeout = std::chrono::seconds(20);
  DecodeWorker worker;
  auto client = SamplerClient::Connect("unix:" + server.unix_socket_path(), options);
  if (!client.ok()) return client.status();
  worker.client = *std::move(client);
  auto shm = ShmBuffer::Create("/" + prefix, kSlots * kSlotBytes);
  if (!shm.ok()) return shm.status();
  worker.shm = *std::move(shm);
  if (absl::Status registered = worker.client->RegisterShm("decode-logits", *worker.shm);
      !registered.ok()) {
    return registered;
  }
  auto stream = worker.client->OpenStream();
  if (!stream.ok()) return stream.status();
  worker.stream = *std::move(stream);
  return worker;
}

TEST(SamplerdRestart, DecodeLoopSurvivesRestartsWithoutCodeOfItsOwn) {
  ServerProcess server(g_samplerd, {"--threads=2", "--registration_lease_ms=900"});
  server.set_unix_socket();
  ASSERT_TRUE(server.Start().ok());
  // Random, not the pid: tests in sandboxes of their own may share a pid and /dev/shm.
  const std::string prefix = "samplerd-restart-" + std::to_string(std::random_device()());
  absl::StatusOr<DecodeWorker> worker = StartDecodeWorker(server, prefix);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto& [client, shm, stream] = *worker;

  auto restart = [&server] {
    server.Stop(SIGKILL);
    EXPECT_TRUE(server.Start().ok());
  };
  Reference reference;
  std::vector<double> recovery_ms;
  int restarts = 0;
  for (int s = 0; s < 100; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    g_phase = s == 20 ? "step 20 (samplerd gone)" : s == 40 ? "step 40 (killed mid-step)"
              : s == 60 ? "step 60 (restarted between steps)" : "decode loop";
    v1::SampleRequest inline_copy;
    const v1::SampleRequest request = MakeStep(s, *shm, &inline_copy);
    std::thread restarter;
    if (s == 20) {  // gone before the step; back 300 ms later
      server.Stop(SIGKILL);
      restarter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        EXPECT_TRUE(server.Start().ok());
      });
      ++restarts;
    } else if (s == 40) {  // killed while the step is sent or computed
      restarter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        restart();
      });
      ++restarts;
    } else if (s == 60) {  // between steps: the keep-alive (every 300 ms) sees the new server
      restart();
      ++restarts;
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<v1::SampleResponse> response = stream->Step(request);
    if (restarter.joinable()) {
      restarter.join();
      recovery_ms.push_back(std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - start).count());
    }
    ASSERT_TRUE(response.ok()) << response.status();
    ASSERT_TRUE(reference.Agrees(inline_copy, *response));
  }

  // Four steps pipelined, then samplerd is killed and started again: all four are resent.
  {
    g_phase = "pipelined steps";
    std::vector<v1::SampleRequest> inline_copies(kSlots);
    for (int i = 0; i < kSlots; ++i) {
      ASSERT_TRUE(stream->Send(MakeStep(100 + i, *shm, &inline_copies[i])).ok());
    }
    restart();
    ++restarts;
    for (int i = 0; i < kSlots; ++i) {
      absl::StatusOr<v1::SampleResponse> response = stream->Receive();
      ASSERT_TRUE(response.ok()) << response.status();
      ASSERT_TRUE(reference.Agrees(inline_copies[i], *response));
    }
  }
  // A rollout: samplerd drains (SIGTERM), refusing the steps it reads from then on, and a new
  // samplerd starts once it has exited; the refused steps are answered by the new one.
  {
    g_phase = "rollout";
    server.Signal(SIGTERM);
    // The new samplerd starts as soon as the old one has exited, whatever the worker is doing
    // (a Send may find the old one gone and wait for the next).
    std::thread rollout([&server] {
      EXPECT_EQ(server.Wait(), 0);
      EXPECT_TRUE(server.Start().ok());
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::vector<v1::SampleRequest> inline_copies(kSlots);
    for (int i = 0; i < kSlots; ++i) {
      const absl::Status sent = stream->Send(MakeStep(110 + i, *shm, &inline_copies[i]));
      EXPECT_TRUE(sent.ok()) << sent;
    }
    for (int i = 0; i < kSlots; ++i) {
      absl::StatusOr<v1::SampleResponse> response = stream->Receive();
      EXPECT_TRUE(response.ok()) << response.status();
      if (response.ok()) EXPECT_TRUE(reference.Agrees(inline_copies[i], *response));
    }
    rollout.join();
    ++restarts;
  }
  // A unary step after a restart.
  {
    g_phase = "unary Sample";
    restart();
    ++restarts;
    v1::SampleRequest inline_copy;
    const v1::SampleRequest request = MakeStep(200, *shm, &inline_copy);
    absl::StatusOr<v1::SampleResponse> response = client->Sample(request);
    ASSERT_TRUE(response.ok()) << response.status();
    ASSERT_TRUE(reference.Agrees(inline_copy, *response));
  }

  // The region is this client's with the last samplerd, mapped there, and has no name.
  auto listed = client->ListBuffers();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->buffers_size(), 1);
  EXPECT_EQ(listed->buffers(0).name(), "decode-logits");
  EXPECT_EQ(listed->buffers(0).owner(),
            absl::StrCat("uid:", geteuid(), "/id:", client->client_id()));
  EXPECT_TRUE(Maps(server.pid(), shm->shm_name())) << shm->shm_name();
  EXPECT_EQ(ShmEntries(prefix), 0);
  EXPECT_TRUE(stream->Close().ok());
  std::printf("decode loop survived %d samplerd restarts (SIGKILL, one a SIGTERM rollout); the steps that spanned one "
              "took %.0f ms (back after 300 ms), %.0f ms (killed mid-step)\n",
              restarts, recovery_ms[0], recovery_ms[1]);
  client.reset();
  shm.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

// A rollout while the worker is between steps, with an answer it has not read yet: the
// draining samplerd ends the waiting stream after --drain_idle_stream_ms (1 s), not at its
// shutdown deadline (30 s here),
// and the worker's next Send, which finds the call ended, keeps that answer (gRPC gives the
// ended call's status only once it is read) and resends only the new step to the next samplerd.
TEST(SamplerdRestart, RolloutBetweenStepsKeepsTheUnreadAnswer) {
  g_phase = "rollout between steps";
  ServerProcess server(g_samplerd, {"--threads=2", "--shutdown_deadline_ms=30000"});
  server.set_unix_socket();
  ASSERT_TRUE(server.Start().ok());
  absl::StatusOr<DecodeWorker> worker =
      StartDecodeWorker(server, "samplerd-rollout-" + std::to_string(std::random_device()()));
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto& [client, shm, stream] = *worker;
  Reference reference;
  std::vector<v1::SampleRequest> inline_copies(2);
  ASSERT_TRUE(stream->Send(MakeStep(300, *shm, &inline_copies[0])).ok());
  // The answer reaches this process and stays unread; samplerd's stream waits for a step.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto drain_start = std::chrono::steady_clock::now();
  server.Signal(SIGTERM);
  ASSERT_EQ(server.Wait(), 0);
  const double drain_ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - drain_start).count();
  EXPECT_LT(drain_ms, 10000) << "the drain waited for the idle stream";
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(stream->Send(MakeStep(301, *shm, &inline_copies[1])).ok());
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::SampleResponse> response = stream->Receive();
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(reference.Agrees(inline_copies[i], *response));
  }
  EXPECT_TRUE(stream->Close().ok());
  std::printf("a rollout between steps drained in %.0f ms\n", drain_ms);
}

// Without waiting (reconnect_timeout 0) a step that finds samplerd gone fails with one clear
// UNAVAILABLE, and a client that waits gives up after its reconnect_timeout.
TEST(SamplerdRestart, ClientsThatDoNotWaitFailClearly) {
  g_phase = "clients that do not wait";
  ServerProcess server(g_samplerd, {"--threads=2"});
  server.set_unix_socket();
  ASSERT_TRUE(server.Start().ok());
  ClientOptions no_wait;
  no_wait.reconnect_timeout = std::chrono::milliseconds(0);
  auto client = SamplerClient::Connect("unix:" + server.unix_socket_path(), no_wait);
  ASSERT_TRUE(client.ok());
  ClientOptions short_wait;
  short_wait.reconnect_timeout = std::chrono::milliseconds(300);
  auto waiting = SamplerClient::Connect("unix:" + server.unix_socket_path(), short_wait);
  ASSERT_TRUE(waiting.ok());
  auto stream = (*client)->OpenStream();
  ASSERT_TRUE(stream.ok());
  v1::SampleRequest request;
  request.set_step_id(1);
  request.mutable_logits()->set_rows(1);
  request.mutable_logits()->set_cols(2);
  request.mutable_logits()->mutable_values()->add_values(0.0f);
  request.mutable_logits()->mutable_values()->add_values(1.0f);
  request.mutable_inputs()->set_vocab_size(2);
  request.mutable_inputs()->set_kind(v1::PREFILL);
  auto* q = request.mutable_inputs()->add_requests();
  q->set_request_id("a");
  q->mutable_params()->set_seq_seed(1);
  ASSERT_TRUE((*stream)->Step(request).ok());
  ASSERT_TRUE((*waiting)->Sample(request).ok());
  server.Stop(SIGKILL);
  absl::StatusOr<v1::SampleResponse> lost = (*stream)->Step(request);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable) << lost.status();
  const auto start = std::chrono::steady_clock::now();
  lost = (*waiting)->Sample(request);
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(lost.status().message(), "reconnect_timeout")) << lost.status();
  EXPECT_GE(waited_ms, 250);
  EXPECT_LT(waited_ms, 5000);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: samplerd_restart_test SAMPLERD\n");
    return 2;
  }
  samplerd::g_samplerd = argv[1];
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    std::fprintf(stderr, "samplerd_restart_test: hung for 120 s in phase '%s'\n",
                 samplerd::g_phase.load());
    std::abort();
  }).detach();
  return RUN_ALL_TESTS();
}
