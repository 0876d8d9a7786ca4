// What issue 26's registration leases cost on the step path: prints figures, asserts nothing.
//
//   bazel run -c opt //bench:lease_bench
//
// Each step samplerd renews its client's lease: one absl::Now() and OwnerLeases::Touch (a mutex
// and a hash lookup). Measured alone, by one thread with 64 owners tracked and by 16 threads
// at once (each its own owner: 16 workers' streams contending for the one mutex), against the
// cheapest real step measured in the same run: one PREFILL row, V = 32,000, T = 0.8, top_p =
// 0.9, through the CPU backend as samplerd runs it (conversion, plan, sampling).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "sampler/cpu_backend.h"
#include "server/owner_leases.h"
#include "tests/in_process.h"

namespace samplerd {
namespace {

using Clock = std::chrono::steady_clock;

// Nanoseconds per Touch when `threads` threads each renew their own owner `iters` times.
double TouchNs(OwnerLeases& leases, int threads, int iters) {
  std::atomic<int> ready{0};
  std::vector<double> ns(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::string owner = "id:owner-" + std::to_string(t);
      ++ready;
      while (ready.load() < threads) {
      }
      const auto start = Clock::now();
      for (int i = 0; i < iters; ++i) leases.Touch(owner, absl::Now());
      ns[t] = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / iters;
    });
  }
  for (std::thread& th : pool) th.join();
  return *std::max_element(ns.begin(), ns.end());
}

double StepUs(CpuBackend& backend) {
  constexpr int kVocab = 32000;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  v1::SampleRequest request;
  request.mutable_logits()->set_rows(1);
  request.mutable_logits()->set_cols(kVocab);
  for (int i = 0; i < kVocab; ++i) request.mutable_logits()->mutable_values()->add_values(normal(rng));
  request.mutable_inputs()->set_kind(v1::PREFILL);
  request.mutable_inputs()->set_vocab_size(kVocab);
  auto* q = request.mutable_inputs()->add_requests();
  q->set_request_id("r");
  q->mutable_params()->set_seq_seed(7);
  q->mutable_params()->set_temperature(0.8f);
  q->mutable_params()->set_top_p(0.9f);
  std::vector<double> us;
  for (int rep = 0; rep < 201; ++rep) {
    const auto start = Clock::now();
    auto response = RunInProcess(backend, request);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (!response.ok()) std::fprintf(stderr, "step failed: %s\n", response.status().ToString().c_str());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace
}  // namespace samplerd

int main() {
  using namespace samplerd;
  OwnerLeases leases(absl::Seconds(5));
  for (int t = 0; t < 64; ++t) leases.Track("id:owner-" + std::to_string(t), absl::Now());
  auto backend = CpuBackend::Create({.num_threads = 1});
  if (!backend.ok()) return 1;
  const double step_us = StepUs(**backend);
  const double one = TouchNs(leases, 1, 2000000);
  const double sixteen = TouchNs(leases, 16, 200000);
  std::printf("lease renewal per step (absl::Now + OwnerLeases::Touch, 64 owners tracked): "
              "%.1f ns (1 thread), %.1f ns (16 threads at once)\n", one, sixteen);
  std::printf("baseline, same run: one PREFILL row V=32000 on the CPU backend: %.1f us median; "
              "the lease adds %.4f%% (1 thread), %.4f%% (16 threads)\n",
              step_us, 100.0 * one / (step_us * 1000.0), 100.0 * sixteen / (step_us * 1000.0));
  return 0;
}
