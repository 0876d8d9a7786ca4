// Issue 25's stress test: random steps of mixed shapes (tests/stress_steps.h: every kind, V from
// 2 to 400,000 with padding, force top-N, masks, adjustments, drafts dense, top-N and pooled,
// valid and invalid requests mixed) sent by many client threads, each on its own connection
// (half of them on a SampleStream), to a real samplerd in its own process; every answer is
// checked against the CPU backend running the same step in this process. On the CPU backend
// the answers must be bitwise the same; on CUDA (the GPU machine) they must agree by SPEC 8
// (sampler/backend_compare.h). Every step is answered: a step fails as a whole only where the
// CPU backend fails it too, with the same code and message.
//
//   stress_test SAMPLERD [--backend=cpu|cuda] [--threads=N] [--scenarios=N] [--seed=N]
//               [--max_elements=N] [--server_flag=F]...
//
// --scenarios is per thread. Under compute-sanitizer, the sanitizer runs this test with
// --target-processes all, which reaches the samplerd it starts (scripts/gpu_stress.sh).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/sampler_client.h"
#include "sampler/backend_compare.h"
#include "sampler/cpu_backend.h"
#include "pipeline/proto_convert.h"
#include "pipeline/step_pipeline.h"
#include "tests/server_process.h"
#include "tests/stress_steps.h"

namespace samplerd {
namespace {

struct Config {
  std::string samplerd;
  std::string backend = "cpu";
  int threads = 6;
  int scenarios = 100;  // per thread
  uint64_t seed = 2500;
  int64_t max_elements = int64_t{1} << 21;
  std::vector<std::string> server_flags;
};
Config g_config;

// A server's answer as the core's result, to compare with the CPU backend's by SPEC 8.
StepResult ResultFromProto(const v1::SampleResponse& response) {
  StepResult out;
  out.step_id = response.step_id();
  for (const v1::RequestResult& r : response.results()) {
    RequestResult result;
    result.request_id = r.request_id();
    result.status = absl::Status(static_cast<absl::StatusCode>(r.status().code()),
                                 r.status().message());
    result.seq_seed = r.seq_seed();
    result.token_ids.assign(r.token_ids().begin(), r.token_ids().end());
    result.num_accepted = r.num_accepted();
    result.logprobs.assign(r.logprobs().begin(), r.logprobs().end());
    for (const v1::TopLogprobs& t : r.top_logprobs()) {
      TopLogprobs top;
      top.token_ids.assign(t.token_ids().begin(), t.token_ids().end());
      top.logprobs.assign(t.logprobs().begin(), t.logprobs().end());
      result.top_logprobs.push_back(std::move(top));
    }
    result.sum_smaller_probs.assign(r.sum_smaller_probs().begin(), r.sum_smaller_probs().end());
    result.prompt_logprobs.assign(r.prompt_logprobs().begin(), r.prompt_logprobs().end());
    out.results.push_back(std::move(result));
  }
  return out;
}

// What one run saw, over every thread.
struct Counts {
  std::atomic<int> steps{0}, step_faults{0}, requests{0}, request_faults{0}, prefill{0},
      decode{0}, draft{0};
  // Failed requests by the start of their message (requests[N] left out): what the run
  // covered.
  std::mutex mu;
  std::map<std::string, int> faults_by_field;
  void AddFault(const absl::Status& status) {
    // The message's first 48 characters after "requests[N]", numbers as N.
    std::string key;
    bool in_number = false;
    for (char c : status.message().substr(status.message().find(']') + 1, 48)) {
      const bool digit = c >= '0' && c <= '9';
      if (digit && !in_number) key += 'N';
      if (!digit) key += c;
      in_number = digit;
    }
    std::lock_guard<std::mutex> lock(mu);
    ++faults_by_field[absl::StrCat(absl::StatusCodeToString(status.code()), " ", key)];
  }
};

// One client thread: its own connection (a worker process's), its own reference CPU backend
// and draft pool.
void RunClient(int thread, const std::string& target, Counts& counts, CompareTally& tally,
               std::mutex& tally_mu) {
  ClientOptions options;
  options.own_connection = true;  // its own peer address: its own draft pool scope
  options.timeout = std::chrono::milliseconds(600000);  // sanitizers slow kernels 10-100x
  auto client = SamplerClient::Connect(target, options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::unique_ptr<SamplerClient::StepStream> stream;
  if (thread % 2 == 1) {
    auto opened = (*client)->OpenStream();
    ASSERT_TRUE(opened.ok()) << opened.status();
    stream = std::move(*opened);
  }
  CpuBackendOptions reference_options;
  reference_options.num_threads = 1;
  auto reference = CpuBackend::Create(reference_options);
  ASSERT_TRUE(reference.ok());
  StressOptions stress;
  stress.max_elements = g_config.max_elements;
  StressStepGenerator generator(g_config.seed * 1000 + thread, stress);
  for (int s = 0; s < g_config.scenarios; ++s) {
    const StressScenario scenario = generator.Next();
    for (size_t k = 0; k < scenario.steps.size(); ++k) {
      const v1::SampleRequest& request = scenario.steps[k];
      const std::string what = "thread " + std::to_string(thread) + " scenario " +
                               std::to_string(s) + " step " + std::to_string(k) + " (" +
                               scenario.what + ")";
      SCOPED_TRACE(what);
      // The reference: the same pipeline and the CPU backend, in this process.
      StepEnvironment env;
      env.seeds = [] { return uint64_t{0}; };
      env.pool_scope = "reference";
      std::unique_ptr<ConvertedStep> converted;
      absl::StatusOr<StepResult> want = RunStep(request, **reference, env, nullptr, &converted);
      // The server's answer; a step failed as a whole comes back as the call's status (unary)
      // or in `error` (stream).
      absl::StatusOr<v1::SampleResponse> got =
          stream != nullptr ? stream->Step(request) : (*client)->Sample(request);
      absl::Status got_status = got.status();
      if (got.ok() && got->has_error()) {
        got_status = absl::Status(static_cast<absl::StatusCode>(got->error().code()),
                                  got->error().message());
      }
      ++counts.steps;
      const v1::StepKind kind = request.inputs().kind();
      (kind == v1::PREFILL ? counts.prefill : kind == v1::DECODE ? counts.decode : counts.draft)++;
      if (!want.ok()) {
        ++counts.step_faults;
        EXPECT_EQ(got_status.code(), want.status().code()) << got_status << " vs " << want.status();
        EXPECT_EQ(got_status.message(), want.status().message());
        continue;
      }
      ASSERT_TRUE(got_status.ok()) << "the server failed a step the CPU backend answered: "
                                   << got_status;
      for (const RequestResult& r : want->results) {
        ++counts.requests;
        if (!r.status.ok()) {
          ++counts.request_faults;
          counts.AddFault(r.status);
        }
      }
      if (g_config.backend == "cpu") {
        // The same backend: bitwise the same answer.
        v1::SampleResponse expected;
        ResultToProto(*want, &expected);
        v1::SampleResponse actual = *got;
        actual.clear_timing();
        EXPECT_EQ(actual.SerializeAsString(), expected.SerializeAsString())
            << "server:\n" << actual.DebugString().substr(0, 4000) << "\nreference:\n"
            << expected.DebugString().substr(0, 4000);
      } else {
        std::lock_guard<std::mutex> lock(tally_mu);
        CompareWithCpu(*want, ResultFromProto(*got), tally, what, converted->step);
      }
    }
    // Entries a failed pooled request left behind: released on both sides, so the pool's
    // capacity never differs between the server and the reference.
    if (!scenario.pooled_ids.empty()) {
      ASSERT_TRUE((*client)->Release(scenario.pooled_ids).ok());
      for (const std::string& id : scenario.pooled_ids) {
        (*reference)->draft_pool().Release(DraftPoolKey("reference", id));
      }
    }
  }
  if (stream != nullptr) {
    EXPECT_TRUE(stream->Close().ok());
  }
}

TEST(Stress, RandomStepsFromManyThreadsMatchTheCpuBackend) {
  std::vector<std::string> flags = {"--backend=" + g_config.backend};
  flags.insert(flags.end(), g_config.server_flags.begin(), g_config.server_flags.end());
  ServerProcess server(g_config.samplerd, flags);
  const std::string log = server.dir() + "/samplerd.log";
  server.set_log_file(log);
  // Long enough for samplerd started under compute-sanitizer.
  ASSERT_TRUE(server.Start(/*timeout_s=*/120).ok());
  // Its pid names its compute-sanitizer log (scripts/gpu_stress.sh): the report is samplerd's.
  std::printf("samplerd pid %d\n", static_cast<int>(server.pid()));
  Counts counts;
  CompareTally tally;
  std::mutex tally_mu;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < g_config.threads; ++t) {
    threads.emplace_back(
        [&, t] { RunClient(t, server.target(), counts, tally, tally_mu); });
  }
  for (std::thread& th : threads) th.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Every step answered, then a clean drain: exit 0.
  EXPECT_EQ(server.Stop(SIGTERM), 0);
  if (::testing::Test::HasFailure()) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    std::printf("samplerd's log:\n%s\n", text.str().substr(0, 20000).c_str());
  }
  std::printf(
      "stress (%s): %d threads, %d steps (%d PREFILL, %d DECODE, %d DRAFT) in %.1f s; "
      "%d steps failed as a whole (as on the CPU reference); %d requests, %d of them failed "
      "alone; %d boundary-band tokens\n",
      g_config.backend.c_str(),
      g_config.threads, counts.steps.load(), counts.prefill.load(), counts.decode.load(),
      counts.draft.load(), seconds, counts.step_faults.load(), counts.requests.load(),
      counts.request_faults.load(), tally.token_mismatches);
  for (const auto& [field, n] : counts.faults_by_field) std::printf("  %5d %s\n", n, field.c_str());
  EXPECT_GT(counts.requests.load(), 4 * counts.request_faults.load());  // most are valid
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: stress_test SAMPLERD [flags]\n");
    return 2;
  }
  samplerd::Config& c = samplerd::g_config;
  c.samplerd = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const std::string& name) -> const char* {
      return absl::StartsWith(arg, name + "=") ? argv[i] + name.size() + 1 : nullptr;
    };
    bool ok = true;
    if (const char* v = value("--backend")) {
      c.backend = v;
    } else if (const char* v = value("--threads")) {
      ok = absl::SimpleAtoi(v, &c.threads);
    } else if (const char* v = value("--scenarios")) {
      ok = absl::SimpleAtoi(v, &c.scenarios);
    } else if (const char* v = value("--seed")) {
      ok = absl::SimpleAtoi(v, &c.seed);
    } else if (const char* v = value("--max_elements")) {
      ok = absl::SimpleAtoi(v, &c.max_elements);
    } else if (const char* v = value("--server_flag")) {
      c.server_flags.push_back(v);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "stress_test: bad argument %s\n", arg.c_str());
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
