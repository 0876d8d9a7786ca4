// Load and soak: samplerd (its own process, CPU backend, loopback) under 32 SampleStreams for
// a bounded time, of which some clients misbehave: they cancel mid-step, never read their
// responses, or go silent with the stream open. Prints steps/s, p50/p99 step latency of the
// well-behaved streams, errors by code, and the server's RSS over time; then sends SIGTERM
// under that load and checks that the server exits 0 within its deadline having answered
// every step it read (its own count, logged at exit).
//
//   bazel run -c opt //bench:soak_bench -- --duration_s=60
//   soak_bench --duration_s=4 --check   # exit 1 if an invariant fails (//bench:soak_test)
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/sampler_client.h"
#include "tests/server_process.h"
#include "tests/test_steps.h"

ABSL_FLAG(std::string, samplerd, "server/samplerd", "the samplerd binary");
ABSL_FLAG(int, duration_s, 20, "how long the load runs before SIGTERM");
ABSL_FLAG(int, streams, 32, "streams in all; a quarter of them misbehave");
ABSL_FLAG(int, rows, 4, "rows (requests) per step");
ABSL_FLAG(int, vocab, 32000, "vocabulary (inline float32 logits)");
ABSL_FLAG(int, threads, 2, "samplerd --threads");
ABSL_FLAG(int, shutdown_deadline_ms, 5000, "samplerd --shutdown_deadline_ms");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "more samplerd flags, comma-separated (e.g. --max_inflight_message_bytes=268435456)");
ABSL_FLAG(int, max_rss_growth_mib, 64,
          "the flat-RSS invariant: growth allowed from the 2-second mark to the end; -1 = not "
          "checked (sanitizer builds, whose quarantine and shadow memory grow by design)");
ABSL_FLAG(bool, check, false, "exit 1 when an invariant fails (for the CI smoke test)");

namespace samplerd {
namespace {

using Clock = std::chrono::steady_clock;

// A PREFILL step of `rows` requests over inline float32 logits, with the benchmarks' usual
// parameters (T = 0.7, top_p 0.95, top_k 50, top-5 logprobs).
v1::SampleRequest Step(int rows, int vocab) {
  v1::SampleRequest request = SmallStep(1, rows, vocab, 7);
  for (v1::RequestInputs& r : *request.mutable_inputs()->mutable_requests()) {
    auto* p = r.mutable_params();
    p->set_temperature(0.7f);
    p->set_top_p(0.95f);
    p->set_top_k(50);
    p->set_top_logprobs(5);
  }
  return request;
}

struct Shared {
  std::atomic<bool> stop{false};
  std::atomic<bool> terminating{false};  // SIGTERM sent: UNAVAILABLE is the expected answer
  std::mutex mu;
  std::vector<double> latencies_us;          // well-behaved streams
  std::map<std::string, int64_t> errors;     // by gRPC code name or "step:<code>"
  std::atomic<int64_t> answered{0};          // responses the well-behaved streams received
  void Error(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    ++errors[terminating.load() ? "after SIGTERM: " + what : what];
  }
};

// A worker's step loop: send, wait, record; until stopped or the stream ends.
void GoodWorker(const std::string& target, int index, Shared& shared, const v1::SampleRequest& step) {
  // The soak ends with samplerd's drain, not a restart: the stream's end is the answer, so the
  // client must not wait for a next samplerd.
  ClientOptions options;
  options.reconnect_timeout = std::chrono::milliseconds(0);
  auto client = SamplerClient::Connect(target, options);
  if (!client.ok()) return shared.Error("connect");
  auto stream = (*client)->OpenStream();
  if (!stream.ok()) return shared.Error("open");
  std::vector<double> mine;
  while (!shared.stop.load()) {
    const auto start = Clock::now();
    auto reply = (*stream)->Step(step);
    if (!reply.ok()) {
      // UNAVAILABLE once the server drains: the stream's end, not an error of the load (before
      // the SIGTERM it is: the key then lacks "after SIGTERM").
      shared.Error(std::string("stream end: ") + absl::StatusCodeToString(reply.status().code()));
      break;
    }
    if (reply->has_error()) shared.Error("step error " + std::to_string(reply->error().code()));
    for (const v1::RequestResult& result : reply->results()) {
      if (result.status().code() != 0 || result.token_ids().empty()) {
        shared.Error("request error " + std::to_string(result.status().code()));
      }
    }
    mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    shared.answered.fetch_add(1);
  }
  std::lock_guard<std::mutex> lock(shared.mu);
  shared.latencies_us.insert(shared.latencies_us.end(), mine.begin(), mine.end());
  (void)index;
}

// Misbehaving clients, through the raw stub (they do what the client library never does).
void Canceller(const std::string& target, Shared& shared, const v1::SampleRequest& step) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  std::mt19937 rng(3);
  while (!shared.stop.load()) {
    grpc::ClientContext context;
    auto stream = stub->SampleStream(&context);
    v1::SampleResponse response;
    for (int i = 0; i < 3 && stream->Write(step); ++i) stream->Read(&response);
    stream->Write(step);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    context.TryCancel();  // mid-step
    stream->Finish();
  }
}

void NeverReads(const std::string& target, Shared& shared, const v1::SampleRequest& step) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->SampleStream(&context);
  // Writes until flow control stops it (the server's responses pile up unread), then idles.
  std::atomic<bool> writing{true};
  std::thread writer([&] {
    for (int i = 0; i < 200 && !shared.stop.load(); ++i) {
      if (!stream->Write(step)) break;
    }
    writing.store(false);
  });
  while (!shared.stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  context.TryCancel();
  writer.join();
  stream->Finish();
}

void Silent(const std::string& target, Shared& shared, const v1::SampleRequest& step) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1::Sampler::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->SampleStream(&context);
  v1::SampleResponse response;
  stream->Write(step);
  stream->Read(&response);
  // Open, silent: no more steps, no half-close, until the server goes away.
  while (!shared.stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  context.TryCancel();
  stream->Finish();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

int Main() {
  const int streams = absl::GetFlag(FLAGS_streams);
  const int rows = absl::GetFlag(FLAGS_rows), vocab = absl::GetFlag(FLAGS_vocab);
  std::vector<std::string> flags = {
      "--threads=" + std::to_string(absl::GetFlag(FLAGS_threads)), "--log_level=info",
      "--shutdown_deadline_ms=" + std::to_string(absl::GetFlag(FLAGS_shutdown_deadline_ms))};
  for (const std::string& f : absl::GetFlag(FLAGS_server_flags)) flags.push_back(f);
  ServerProcess server(absl::GetFlag(FLAGS_samplerd), flags);
  const std::string log_path = server.dir() + "/samplerd.log";
  server.set_log_file(log_path);
  if (!server.Start().ok()) {
    std::fprintf(stderr, "samplerd did not start\n");
    return 1;
  }
  const v1::SampleRequest step = Step(rows, vocab);
  const int bad = streams / 4;
  const int cancellers = bad - 2 * (bad / 3), never_read = bad / 3, silent = bad / 3;
  const int good = streams - bad;
  std::printf("soak: %d streams (%d well-behaved, %d cancelling mid-step, %d never reading, "
              "%d silent), steps of %d x %d float32 inline (%.1f MB), %d s\n",
              streams, good, cancellers, never_read, silent, rows, vocab,
              step.ByteSizeLong() / 1e6, absl::GetFlag(FLAGS_duration_s));
  Shared shared;
  std::vector<std::thread> threads;
  for (int i = 0; i < good; ++i) {
    threads.emplace_back([&, i] { GoodWorker(server.target(), i, shared, step); });
  }
  for (int i = 0; i < cancellers; ++i) {
    threads.emplace_back([&] { Canceller(server.target(), shared, step); });
  }
  for (int i = 0; i < never_read; ++i) {
    threads.emplace_back([&] { NeverReads(server.target(), shared, step); });
  }
  for (int i = 0; i < silent; ++i) {
    threads.emplace_back([&] { Silent(server.target(), shared, step); });
  }

  // RSS over time, every second; the well-behaved answers per second.
  const auto start = Clock::now();
  std::vector<int64_t> rss;
  int64_t last_answered = 0;
  std::printf("  t(s)  steps/s   RSS(MiB)\n");
  for (int t = 1; t <= absl::GetFlag(FLAGS_duration_s); ++t) {
    std::this_thread::sleep_until(start + std::chrono::seconds(t));
    rss.push_back(server.RssKib());
    const int64_t answered = shared.answered.load();
    std::printf("  %4d  %7lld   %8.1f\n", t, static_cast<long long>(answered - last_answered),
                rss.back() / 1024.0);
    last_answered = answered;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t answered_under_load = shared.answered.load();

  // SIGTERM under load: the well-behaved streams keep sending until theirs ends.
  const auto term = Clock::now();
  shared.terminating.store(true);
  server.Signal(SIGTERM);
  const int exit_code = server.Wait();
  const double stop_ms = std::chrono::duration<double, std::milli>(Clock::now() - term).count();
  shared.stop.store(true);
  for (std::thread& t : threads) t.join();

  std::ifstream log(log_path);
  std::stringstream text;
  text << log.rdbuf();
  std::smatch m;
  const std::string all = text.str();
  int64_t read = -1, served = -1;
  if (std::regex_search(all, m, std::regex("(\\d+) steps read, (\\d+) answered"))) {
    read = std::stoll(m[1]);
    served = std::stoll(m[2]);
  }
  const int64_t warm = rss.size() > 2 ? rss[1] : (rss.empty() ? 0 : rss[0]);
  const int64_t peak = rss.empty() ? 0 : *std::max_element(rss.begin(), rss.end());
  std::printf("steps/s (well-behaved streams): %.0f; step latency p50 %.0f us, p99 %.0f us\n",
              answered_under_load / seconds, Percentile(shared.latencies_us, 0.5),
              Percentile(shared.latencies_us, 0.99));
  std::printf("server RSS: %.1f MiB at 2 s, %.1f MiB at the end, peak %.1f MiB\n", warm / 1024.0,
              rss.empty() ? 0.0 : rss.back() / 1024.0, peak / 1024.0);
  std::printf("errors and stream ends:");
  for (const auto& [what, n] : shared.errors) std::printf(" [%s] %lld", what.c_str(), static_cast<long long>(n));
  std::printf("\nSIGTERM under load: exit %d after %.0f ms (deadline %d ms); server read %lld "
              "steps, answered %lld\n",
              exit_code, stop_ms, absl::GetFlag(FLAGS_shutdown_deadline_ms),
              static_cast<long long>(read), static_cast<long long>(served));
  bool ok = exit_code == 0 && read >= 0 && read == served && answered_under_load > 0 &&
            stop_ms < absl::GetFlag(FLAGS_shutdown_deadline_ms) + 3000;
  // Flat RSS: after warm-up, the end is within the allowed growth of the 2-second mark.
  const int max_growth_mib = absl::GetFlag(FLAGS_max_rss_growth_mib);
  if (max_growth_mib >= 0 && rss.size() > 2 && rss.back() - warm > max_growth_mib * 1024) {
    ok = false;
  }
  for (const auto& [what, n] : shared.errors) {
    // Before the SIGTERM every well-behaved step is answered, each request with tokens, and
    // no stream ends (the keys after it start with "after SIGTERM").
    if (what.rfind("step error", 0) == 0 || what.rfind("request error", 0) == 0 ||
        what.rfind("stream end", 0) == 0 || what == "connect" || what == "open") {
      ok = false;
    }
  }
  std::printf("%s\n", ok ? "invariants hold" : "INVARIANT FAILED");
  return absl::GetFlag(FLAGS_check) && !ok ? 1 : 0;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  return samplerd::Main();
}
