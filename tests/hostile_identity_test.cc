// Issue 45's lockouts and identity attacks against the real samplerd in its own process
// (loopback, port 0, bounded): one client holding every stream, channels opened at once past
// the limit, lease entries left by failed calls, another user's process ending or reading a
// victim's registrations, the metrics listener. Each of these failed on the code before
// issue 45 (the figures in each test's comment) and passes now.
//
//   hostile_identity_test SAMPLERD ROGUE_CLIENT
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/sampler_client.h"
#include "client/shm_buffer.h"
#include "grpcpp/grpcpp.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "tests/server_process.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

std::string g_samplerd;
std::string g_rogue;

std::string ShmName(const std::string& what) {
  return "/samplerd-identity-" + std::to_string(getpid()) + "-" + what;
}

// Runs `argv`, returns its exit code and what it printed.
std::pair<int, std::string> RunCapture(std::vector<std::string> argv) {
  int out[2];
  if (pipe(out) != 0) return {-1, ""};
  const pid_t pid = SpawnProcess(std::move(argv), {.stdout_fd = out[1], .close_fd = out[0]});
  close(out[1]);
  if (pid < 0) {
    close(out[0]);
    return {-1, ""};
  }
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = read(out[0], buffer, sizeof(buffer))) > 0) text.append(buffer, n);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text};
}

// A raw SampleStream under a chosen client id, kept open: what a client holding streams has.
struct RawStream {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> stream;
};

// Opens a stream as `client_id` and has it answer one step: OK, or the status that refused it.
absl::Status OpenStream(v1::Sampler::Stub& stub, const std::string& client_id,
                        std::vector<std::unique_ptr<RawStream>>* held) {
  auto s = std::make_unique<RawStream>();
  s->context.AddMetadata("samplerd-client-id", client_id);
  s->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  s->stream = stub.SampleStream(&s->context);
  v1::SampleResponse response;
  if (!s->stream->Write(SmallStep(1)) || !s->stream->Read(&response)) {
    const grpc::Status status = s->stream->Finish();
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  held->push_back(std::move(s));
  return absl::OkStatus();
}

void CloseAll(std::vector<std::unique_ptr<RawStream>>* held) {
  for (auto& s : *held) {
    s->stream->WritesDone();
    v1::SampleResponse ignored;
    while (s->stream->Read(&ignored)) {
    }
    (void)s->stream->Finish();
  }
  held->clear();
}

class HostileIdentity : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> flags = {}) {
    flags.push_back("--threads=2");
    server_ = std::make_unique<ServerProcess>(g_samplerd, std::move(flags));
    ASSERT_TRUE(server_->Start().ok());
    auto client = SamplerClient::Connect(server_->target());
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    stub_ = v1::Sampler::NewStub(
        grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    client_.reset();
    stub_.reset();
    if (server_) EXPECT_EQ(server_->Stop(SIGTERM), 0);
  }
  // What `rogue_client --uid=UID --client_id=ID ACTION ARGS` printed: "CODE message".
  std::string Rogue(int uid, const std::string& client_id, std::vector<std::string> action) {
    std::vector<std::string> argv = {g_rogue, "--target=" + server_->target(),
                                     absl::StrCat("--uid=", uid), "--client_id=" + client_id};
    argv.insert(argv.end(), action.begin(), action.end());
    auto [rc, out] = RunCapture(argv);
    EXPECT_EQ(rc, 0) << out;
    return out;
  }
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<SamplerClient> client_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
};

// Issue 45 item 5: one client with 260 idle SampleStreams made every other client's Sample,
// GetServerInfo and new stream fail RESOURCE_EXHAUSTED while health answered SERVING. Now one
// client holds at most --max_streams_per_client; all clients together at most
// --max_open_streams, below gRPC's thread limit, so unary calls still find a thread; and health
// says NOT_SERVING while no stream can be opened.
TEST_F(HostileIdentity, NoClientHoldsEveryStream) {
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--max_rpc_threads=48", "--max_open_streams=24", "--max_streams_per_client=8"}));
  std::vector<std::unique_ptr<RawStream>> held;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(OpenStream(*stub_, "greedy", &held).ok()) << i;
  absl::Status ninth = OpenStream(*stub_, "greedy", &held);
  EXPECT_EQ(ninth.code(), absl::StatusCode::kResourceExhausted) << ninth;
  EXPECT_THAT(std::string(ninth.message()), HasSubstr("--max_streams_per_client"));
  // Another client still opens streams.
  ASSERT_TRUE(OpenStream(*stub_, "modest", &held).ok());
  // Fill the server: 8 + 1 + 8 + 7 = 24.
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(OpenStream(*stub_, "greedy-2", &held).ok());
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(OpenStream(*stub_, "greedy-3", &held).ok());
  absl::Status full = OpenStream(*stub_, "late", &held);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_THAT(std::string(full.message()), HasSubstr("--max_open_streams"));
  // Unary calls, GetServerInfo and health still answer; health says no new work fits.
  auto reply = client_->Sample(SmallStep(7));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->results_size(), 3);
  EXPECT_TRUE(client_->GetServerInfo().ok());
  auto serving = client_->IsServing();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);
  // One stream closed: streams open again, and health is SERVING again.
  held.back()->stream->WritesDone();
  (void)held.back()->stream->Finish();
  held.pop_back();
  bool back = false;
  for (int i = 0; i < 200 && !back; ++i) {
    auto s = client_->IsServing();
    back = s.ok() && *s;
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(back);
  EXPECT_TRUE(OpenStream(*stub_, "late", &held).ok());
  CloseAll(&held);
}

// Issue 45 item 6: 160 channels opened at once gave 65 (limit 64): the count and the insert
// were not under one lock. Each of 160 clients opens one channel at the same moment.
TEST_F(HostileIdentity, ChannelsOpenedAtOnceNeverExceedTheLimit) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  constexpr int kClients = 160;
  std::vector<std::unique_ptr<SamplerClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    auto c = SamplerClient::Connect(server_->target());
    ASSERT_TRUE(c.ok());
    clients.push_back(std::move(*c));
  }
  std::vector<std::unique_ptr<SamplerClient::StepChannel>> channels(kClients);
  std::atomic<int> opened{0}, refused{0}, other{0};
  std::atomic<int> ready{0};
  absl::Mutex other_mu;
  std::vector<std::string> others;  // what the other answers were, for a failure's message
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kClients) std::this_thread::yield();
      auto channel = clients[i]->OpenChannel(4096);
      if (channel.ok()) {
        channels[i] = std::move(*channel);
        ++opened;
      } else if (channel.status().code() == absl::StatusCode::kResourceExhausted) {
        ++refused;
      } else {
        ++other;
        absl::MutexLock lock(&other_mu);
        others.push_back(channel.status().ToString());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(opened.load(), 64);
  EXPECT_EQ(refused.load(), kClients - 64);
  EXPECT_EQ(other.load(), 0) << absl::StrJoin(others, "; ");
  channels.clear();
  // One client: at most --max_channels_per_client (8).
  std::vector<std::unique_ptr<SamplerClient::StepChannel>> mine;
  absl::Status ninth;
  for (int i = 0; i < 9; ++i) {
    auto channel = client_->OpenChannel(4096);
    if (!channel.ok()) {
      ninth = channel.status();
      break;
    }
    mine.push_back(std::move(*channel));
  }
  EXPECT_EQ(mine.size(), 8u);
  EXPECT_EQ(ninth.code(), absl::StatusCode::kResourceExhausted) << ninth;
  EXPECT_THAT(std::string(ninth.message()), HasSubstr("--max_channels_per_client"));
}

// Issue 45 item 7: with --registration_lease_ms=0 each failed RegisterBuffer or
// OpenStepChannel recorded its client id for ever (152k calls: +54 MB). A client is tracked
// only once it owns something: 300 failed calls of 300 ids leave no entry.
TEST_F(HostileIdentity, FailedRegistrationsLeaveNoLeaseEntries) {
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--registration_lease_ms=0", "--metrics_address=127.0.0.1:0"}));
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext context;
    context.AddMetadata("samplerd-client-id", absl::StrCat("failing-", i));
    v1::RegisterBufferRequest request;
    request.set_name(absl::StrCat("r", i));
    request.set_kind(v1::HOST_SHM);
    request.set_shm_name(i % 2 ? "/samplerd-identity-none" : "no-slash");
    request.set_byte_size(64);
    v1::RegisterBufferResponse response;
    ASSERT_FALSE(stub_->RegisterBuffer(&context, request, &response).ok());
    grpc::ClientContext channel_context;
    channel_context.AddMetadata("samplerd-client-id", absl::StrCat("failing-", i));
    v1::OpenStepChannelRequest open;
    open.set_shm_name("/samplerd-identity-none");
    open.set_capacity_bytes(16);
    v1::OpenStepChannelResponse opened;
    ASSERT_FALSE(stub_->OpenStepChannel(&channel_context, open, &opened).ok());
  }
  const std::string metrics = HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(metrics, "samplerd_tracked_clients"), 0) << metrics.substr(0, 200);
  // One that succeeds is tracked, and forgotten once it unregistered its only region.
  auto shm = ShmBuffer::Create(ShmName("tracked"), 4096);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(client_->RegisterShm("tracked", **shm).ok());
  EXPECT_EQ(MetricValue(HttpGet(server_->metrics_port(), "/metrics"), "samplerd_tracked_clients"),
            1);
  ASSERT_TRUE(client_->UnregisterBuffer("tracked").ok());
  EXPECT_EQ(MetricValue(HttpGet(server_->metrics_port(), "/metrics"), "samplerd_tracked_clients"),
            0);
}

// Issue 45 items 8 and 9: ListBuffers showed every owner id; a client that opened a
// SampleStream with a victim's id and cancelled it released the victim's regions at once (the
// victim's next step: NOT_FOUND). Now a client sees its own regions only, and a process of
// another uid claiming the victim's id is another client: the victim keeps its region.
TEST_F(HostileIdentity, AnotherUserCannotSeeOrEndAVictimsRegistrations) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  ASSERT_NO_FATAL_FAILURE(StartServer({"--registration_lease_ms=0"}));
  auto shm = ShmBuffer::Create(ShmName("victim"), 3 * 64 * 4);
  ASSERT_TRUE(shm.ok());
  for (int i = 0; i < 3 * 64; ++i) static_cast<float*>((*shm)->data())[i] = 0.01f * (i % 64);
  ASSERT_TRUE(client_->RegisterShm("victim-logits", **shm).ok());
  v1::SampleRequest step = SmallStep(3);
  step.mutable_logits()->clear_values();
  step.mutable_logits()->set_dtype(v1::FLOAT32);
  step.mutable_logits()->mutable_buffer()->set_name("victim-logits");
  ASSERT_TRUE(client_->Sample(step).ok());
  const std::string victim = client_->client_id();
  // Neither the other user nor another client of this user sees it.
  EXPECT_EQ(Rogue(65534, victim, {"list"}), "0 0\n");
  EXPECT_EQ(Rogue(65534, "someone", {"list"}), "0 0\n");
  // The other user's stream under the victim's id, cancelled as a killed worker's would be.
  EXPECT_THAT(Rogue(65534, victim, {"stream-cancel"}), testing::StartsWith("1 "));  // CANCELLED
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto after = client_->Sample(step);
  ASSERT_TRUE(after.ok()) << after.status();
  auto listed = client_->ListBuffers();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->buffers_size(), 1);
  EXPECT_EQ(listed->buffers(0).owner(), absl::StrCat("uid:0/id:", victim));
}

// Issue 45 item 10: a process of another user (uid 65534), unable to read a root-owned 0600
// shm object, registered it through a root samplerd's loopback port and read its contents back
// from top_logprobs. A client may register only shared memory its own uid owns.
TEST_F(HostileIdentity, AnotherUserCannotRegisterMemoryItCannotRead) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string name = ShmName("secret");
  auto secret = ShmBuffer::Create(name, 4096);  // root's, mode 0600
  ASSERT_TRUE(secret.ok());
  const std::string answer = Rogue(65534, "deputy", {"register", name, "4096"});
  EXPECT_THAT(answer, testing::StartsWith("7 "));  // PERMISSION_DENIED
  EXPECT_THAT(answer, HasSubstr("shm_name"));
  EXPECT_THAT(answer, HasSubstr("not by the calling client's uid 65534"));
  // Its owner registers it as before.
  EXPECT_TRUE(client_->RegisterShm("secret", **secret).ok());
}

// Issue 45 item 11: --metrics_address=0.0.0.0:0 was served in plaintext although the gRPC
// listener refuses plaintext off loopback, and two idle half-sent HTTP requests blocked every
// scrape for over 5 s.
TEST_F(HostileIdentity, MetricsListenerFollowsTheListenerRuleAndTimesOutSlowClients) {
  {
    ServerProcess refused(g_samplerd, {"--metrics_address=0.0.0.0:0"});
    EXPECT_FALSE(refused.Start(5).ok());  // exits 2 at start-up, naming the flag
  }
  ASSERT_NO_FATAL_FAILURE(
      StartServer({"--metrics_address=0.0.0.0:0", "--allow_insecure_metrics"}));
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->metrics_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // never finished
    ASSERT_EQ(write(fd, half.data(), half.size()), static_cast<ssize_t>(half.size()));
    idle.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string metrics = HttpGet(server_->metrics_port(), "/metrics");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(metrics, HasSubstr("samplerd_step_seconds"));
  EXPECT_LT(seconds, 2.5) << "a scrape behind 4 idle half-sent requests";
  for (int fd : idle) close(fd);
}


// Nothing closed a connection that never sent a byte, each holding a descriptor and ~13 KB:
// 15,000 idle ones from one unprivileged process added 191 MiB to samplerd's RSS, and at its
// descriptor limit samplerd accepted no other client at all. Now a local user holds at most
// --max_connections_per_uid connections (and all clients --max_connections); one more is
// closed at accept, another user is still served, and a connection that ends frees its place.
TEST_F(HostileIdentity, IdleConnectionsAreBoundedPerUser) {
  ASSERT_NO_FATAL_FAILURE(StartServer(
      {"--max_connections_per_uid=20", "--max_connections=40", "--metrics_address=127.0.0.1:0"}));
  const int port = server_->port();
  auto connect_tcp = [port] {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  };
  // A served connection receives the server's HTTP/2 SETTINGS frame unasked; a refused one is
  // closed (end of file or a reset).
  auto served = [](int fd) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return false;
    char byte;
    return recv(fd, &byte, 1, MSG_PEEK) == 1;
  };
  std::vector<int> idle;
  int refused = 0;
  for (int i = 0; i < 25; ++i) {
    const int fd = connect_tcp();
    if (served(fd)) {
      idle.push_back(fd);
    } else {
      ++refused;
      close(fd);
    }
  }
  // This process (uid 0) had no other connection to the server yet.
  EXPECT_EQ(idle.size(), 20u);
  EXPECT_EQ(refused, 5);
  // Another user is served meanwhile.
  EXPECT_EQ(Rogue(65534, "other-user", {"list"}), "0 0\n");
  // Five connections end: five new ones are served (the server closes its side once it reads
  // the end of file, then the ledger finds those descriptors closed).
  for (int i = 0; i < 5; ++i) {
    close(idle.back());
    idle.pop_back();
  }
  int again = 0;
  for (int attempt = 0; attempt < 100 && again < 5; ++attempt) {
    const int fd = connect_tcp();
    if (served(fd)) {
      idle.push_back(fd);
      ++again;
    } else {
      close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  EXPECT_EQ(again, 5);
  // The metrics: what is held and what was refused (the gauge is refreshed each second).
  double held = -1, refused_total = -1;
  for (int i = 0; i < 40 && held != 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string metrics = HttpGet(server_->metrics_port(), "/metrics");
    held = MetricValue(metrics, "samplerd_connections");
    refused_total = MetricValue(metrics, "samplerd_connections_refused_total");
  }
  // 20 idle ones; the metrics' own HTTP connection is not a gRPC listener's.
  EXPECT_EQ(held, 20);
  EXPECT_GE(refused_total, 5);
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: hostile_identity_test SAMPLERD ROGUE_CLIENT\n");
    return 2;
  }
  samplerd::g_samplerd = argv[1];
  samplerd::g_rogue = argv[2];
  return RUN_ALL_TESTS();
}
