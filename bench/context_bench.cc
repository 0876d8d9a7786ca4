// The cost of long contexts with penalties and DRY, as issue 45's hostile clients sent them,
// measured against samplerd binaries in their own processes (CPU backend, loopback), each
// configuration alternating between the binaries named, in one run:
//   decode   a 1 MB DECODE message (1M output tokens, q = 64 rows, repetition penalty):
//            the step's time;
//   prompt   one request of a --prompt_tokens prompt with a repetition penalty beside a small
//            one: the step's time, the server's peak RSS growth, and what the request got;
//   stall    another client's light step (3 rows of 64) while a heavy step runs (DECODE
//            q = 128, a 1M-token context of one repeated token, DRY and repetition): its
//            latency against the same step alone.
//
//   bazel run -c opt //bench:context_bench -- --samplerd=NEW[,OLD] [--prompt_tokens=16777216]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "client/sampler_client.h"
#include "tests/server_process.h"
#include "tests/test_steps.h"

ABSL_FLAG(std::string, samplerd, "", "samplerd binaries, comma-separated (the first: the candidate)");
ABSL_FLAG(int64_t, prompt_tokens, int64_t{16} << 20, "the prompt of the `prompt` case");
ABSL_FLAG(int, rounds, 2, "rounds of each case per binary, alternating");

namespace samplerd {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A DECODE request of `rows` rows over [rows, vocab] inline logits, with uniform dense drafts
// of one token, and `context` tokens of `token` as its output (or prompt) history.
v1::SampleRequest Decode(int rows, int vocab, int64_t context, bool as_output, bool dry) {
  v1::SampleRequest step = SmallStep(1, rows, vocab);
  v1::SamplerInputs* in = step.mutable_inputs();
  in->set_kind(v1::DECODE);
  in->clear_requests();
  v1::RequestInputs* r = in->add_requests();
  r->set_request_id("heavy");
  r->set_num_rows(rows);
  for (int j = 0; j + 1 < rows; ++j) r->add_draft_token_ids(5);
  SetUniformDrafts(r, rows, vocab);
  auto* history = as_output ? r->mutable_output_token_ids() : r->mutable_prompt_token_ids();
  history->Reserve(static_cast<int>(context));
  for (int64_t i = 0; i < context; ++i) history->Add(dry ? 5 : static_cast<int32_t>(i % vocab));
  r->mutable_params()->set_seq_seed(1);
  r->mutable_params()->set_repetition_penalty(1.1f);
  if (dry) r->mutable_params()->set_dry_multiplier(0.8f);
  return step;
}

std::unique_ptr<SamplerClient> Connect(const ServerProcess& server) {
  ClientOptions options;
  options.own_connection = true;
  options.timeout = std::chrono::milliseconds(600000);
  auto client = SamplerClient::Connect(server.target(), options);
  return client.ok() ? std::move(*client) : nullptr;
}

std::string Outcome(const absl::StatusOr<v1::SampleResponse>& reply) {
  if (!reply.ok()) return std::string(absl::StatusCodeToString(reply.status().code()));
  const int code = reply->results(0).status().code();
  return code == 0 ? "OK" : absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

void RunCases(const std::string& binary, const std::string& label) {
  ServerProcess server(binary, {"--threads=2", "--backend=cpu"});
  if (!server.Start().ok()) {
    std::printf("%s: did not start\n", label.c_str());
    return;
  }
  auto client = Connect(server);
  auto other = Connect(server);
  // decode: 1M output tokens (~1 MB), q = 64, repetition penalty.
  {
    const v1::SampleRequest step = Decode(64, 64, int64_t{1} << 20, true, false);
    const auto start = Clock::now();
    auto reply = client->Sample(step);
    std::printf("%-10s decode  %5.1f MB message, q = 64: %9.1f ms  (%s)\n", label.c_str(),
                step.ByteSizeLong() / 1e6, Ms(Clock::now() - start), Outcome(reply).c_str());
  }
  // prompt: a long prompt with a repetition penalty, beside a small request.
  {
    v1::SampleRequest step = SmallStep(2, 2, 64);
    v1::RequestInputs* big = step.mutable_inputs()->mutable_requests(0);
    const int64_t n = absl::GetFlag(FLAGS_prompt_tokens);
    big->mutable_prompt_token_ids()->Reserve(static_cast<int>(n));
    for (int64_t i = 0; i < n; ++i) big->add_prompt_token_ids(static_cast<int32_t>(i % 64));
    big->mutable_params()->set_repetition_penalty(1.1f);
    const int64_t rss_before = server.RssKib("VmHWM:");
    const auto start = Clock::now();
    auto reply = client->Sample(step);
    const double ms = Ms(Clock::now() - start);
    std::printf("%-10s prompt  %lld tokens (%.0f MB): %9.1f ms, peak RSS +%lld MiB  (%s)\n",
                label.c_str(), static_cast<long long>(n), step.ByteSizeLong() / 1e6, ms,
                static_cast<long long>((server.RssKib("VmHWM:") - rss_before) / 1024),
                Outcome(reply).c_str());
  }
  // stall: the light step alone, then behind the heavy one.
  {
    std::vector<double> alone;
    for (int i = 0; i < 20; ++i) {
      const auto start = Clock::now();
      (void)other->Sample(SmallStep(3));
      alone.push_back(Ms(Clock::now() - start));
    }
    std::sort(alone.begin(), alone.end());
    const v1::SampleRequest heavy = Decode(128, 64, int64_t{1} << 20, false, true);
    Clock::time_point heavy_end;
    const auto start = Clock::now();
    std::thread t([&] {
      (void)client->Sample(heavy);
      heavy_end = Clock::now();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto sent = Clock::now();
    (void)other->Sample(SmallStep(4));
    const double behind = Ms(Clock::now() - sent);
    t.join();
    std::printf("%-10s stall   light step alone p50 %.2f ms; sent 200 ms into a heavy step of "
                "%.0f ms: %.1f ms\n",
                label.c_str(), alone[alone.size() / 2], Ms(heavy_end - start), behind);
  }
  client.reset();
  other.reset();
  server.Stop(SIGTERM);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> binaries =
      absl::StrSplit(absl::GetFlag(FLAGS_samplerd), ',', absl::SkipEmpty());
  if (binaries.empty()) {
    std::fprintf(stderr, "usage: context_bench --samplerd=NEW[,OLD]\n");
    return 2;
  }
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t b = 0; b < binaries.size(); ++b) {
      samplerd::RunCases(binaries[b], b == 0 ? "candidate" : "baseline");
    }
  }
  return 0;
}
