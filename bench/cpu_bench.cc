// CPU backend benchmark: prints figures, asserts nothing (targets are read off the ratios).
//
//   bazel run -c opt //bench:cpu_bench             # all sections
//   bazel run -c opt //bench:cpu_bench -- prefill  # one section: prefill | decode
//
// prefill: V = 129,280, fp32, T = 0.7, top_p = 0.95, top_k = 50, top-5 logprobs, R = 1, 16, 64
//   rows. The baseline is the float64 full-stable-sort reference (sampler/reference_sampler)
//   running the same step on one thread, measured in the same run; the ratio is per row.
// decode: 64 requests x 6 rows (R = 384) verified against dense and top-N (N = 1024) drafts of a
//   draft model that is the target plus noise, vs a PREFILL step of the same 384 rows, same
//   backend and run: the extra cost of verification.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sampler/cpu_backend.h"
#include "sampler/reference_sampler.h"
#include "sampler/spec_rules.h"
#include "sampler/test_util.h"
#include "sampler/token_updates.h"
#include "sampler/validate.h"
#include "bench/bench_params.h"

namespace samplerd {
namespace {

constexpr int32_t kVocab = kBenchVocab;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Median seconds of `reps` calls of fn (after one warm-up call).
template <typename Fn>
double MedianSeconds(int reps, Fn fn) {
  fn();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(Seconds(std::chrono::steady_clock::now() - start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void RunOrDie(CpuBackend& backend, const Step& step) {
  auto plan = PlanStep(step, Limits{}, RandomSeedSource());
  if (!plan.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(plan.status().message()).c_str());
    std::exit(1);
  }
  auto result = backend.Sample(*plan);
  if (!result.ok() || !result->results[0].status.ok()) {
    std::fprintf(stderr, "sample failed\n");
    std::exit(1);
  }
}

Step PrefillStep(const HostLogits& logits, int32_t rows) {
  Step step = MakeStep(StepKind::kPrefill, logits, kVocab);
  for (int32_t r = 0; r < rows; ++r) {
    RequestInputs req = PrefillRequest("r" + std::to_string(r), r, 1000 + r, 100 + r);
    req.params = BenchParams(1000 + r);
    step.requests.push_back(req);
  }
  return step;
}

void BenchPrefill() {
  std::printf("== prefill: V=%d fp32 T=0.7 top_p=0.95 top_k=50 top-5 logprobs\n", kVocab);
  const HostLogits logits(64, kVocab, /*seed=*/1, /*scale=*/2.0f);
  auto one = CpuBackend::Create({.num_threads = 1});
  auto all = CpuBackend::Create({});
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // Baseline: the full-sort float64 reference, one thread, per row.
  auto params = NormalizeParams(BenchParams(1), Limits{}, "p");
  ReferenceOptions ref_options;
  ref_options.vocab_size = kVocab;
  std::vector<float> row = logits.RowVector(0);
  const double ref_row_s = MedianSeconds(5, [&] {
    const ReferenceRow ref = ReferenceProcess(row, *params, ref_options);
    volatile int32_t token = ReferenceDraw(ref, UniformDouble(1, 123));
    auto top = ReferenceTop(ref, 5);
    (void)token;
    (void)top;
  });
  std::printf("baseline full-sort reference: %.3f ms/row (%.0f rows/s, 1 thread)\n",
              ref_row_s * 1e3, 1.0 / ref_row_s);
  std::printf("%6s %14s %14s %16s %16s\n", "R", "1-thread ms", "rows/s", "ratio/row(1t)",
              "rows/s (" "all)");
  for (int32_t rows : {1, 16, 64}) {
    const Step step = PrefillStep(logits, rows);
    const double t1 = MedianSeconds(rows == 1 ? 200 : 20, [&] { RunOrDie(**one, step); });
    const double tn = MedianSeconds(rows == 1 ? 200 : 20, [&] { RunOrDie(**all, step); });
    std::printf("%6d %14.3f %14.0f %15.1fx %16.0f\n", rows, t1 * 1e3, rows / t1,
                ref_row_s / (t1 / rows), rows / tn);
  }
  std::printf("(all = %d threads)\n", threads);
}

void BenchDecode() {
  const int32_t requests = 64, q = 6, rows = requests * q, drafts = q - 1, top_n = 1024;
  std::printf("== decode: %d requests x %d rows (R=%d), V=%d, same params; vs PREFILL of %d rows\n",
              requests, q, rows, kVocab, rows);
  const HostLogits logits(rows, kVocab, /*seed=*/2, /*scale=*/2.0f);
  // Draft distributions: the draft model is the target with noise, so some drafts are accepted.
  HostLogits dense(requests * drafts, kVocab);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::vector<int32_t>> draft_tokens(requests);
  std::vector<std::vector<int32_t>> topn_ids(requests);
  std::vector<HostLogits> topn_values;
  topn_values.reserve(requests);
  for (int32_t i = 0; i < requests; ++i) {
    topn_values.emplace_back(drafts, top_n);
    for (int32_t j = 0; j < drafts; ++j) {
      const float* target = logits.values.data() + static_cast<size_t>(i * q + j) * kVocab;
      float* d = dense.Row(i * drafts + j);
      // The draft model: the target at T = 0.7 plus noise, sampling from its own top 50.
      float max = -1e30f;
      for (int32_t t = 0; t < kVocab; ++t) max = std::max(max, d[t] = target[t] / 0.7f + noise(rng));
      std::vector<float> sorted(d, d + kVocab);
      std::nth_element(sorted.begin(), sorted.begin() + 49, sorted.end(), std::greater<float>());
      const float cut = sorted[49];
      double z = 0.0;
      for (int32_t t = 0; t < kVocab; ++t) {
        if (d[t] < cut) d[t] = -std::numeric_limits<float>::infinity();
        z += std::exp(static_cast<double>(d[t] - max));
      }
      for (int32_t t = 0; t < kVocab; ++t) d[t] = static_cast<float>(d[t] - max - std::log(z));
      // The draft token: a draw from the draft distribution, as a draft model would make.
      const double u = uniform(rng);
      double cumulative = 0.0;
      int32_t token = kVocab - 1;
      for (int32_t t = 0; t < kVocab; ++t) {
        cumulative += std::exp(static_cast<double>(d[t]));
        if (cumulative > u) {
          token = t;
          break;
        }
      }
      draft_tokens[i].push_back(token);
      std::vector<int32_t> ids(kVocab);
      for (int32_t t = 0; t < kVocab; ++t) ids[t] = t;
      std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(),
                        [&](int32_t a, int32_t b) { return d[a] > d[b]; });
      for (int32_t k = 0; k < top_n; ++k) {
        topn_ids[i].push_back(ids[k]);
        topn_values[i].Row(j)[k] = d[ids[k]];
      }
    }
  }
  auto backend = CpuBackend::Create({});
  auto decode_step = [&](bool use_topn) {
    Step step = MakeStep(StepKind::kDecode, logits, kVocab);
    for (int32_t i = 0; i < requests; ++i) {
      RequestInputs r;
      r.request_id = "r" + std::to_string(i);
      r.first_row = i * q;
      r.num_rows = q;
      r.sample_position = 500 + i;
      r.params = BenchParams(77 + i);
      r.draft_token_ids = draft_tokens[i];
      if (use_topn) {
        r.drafts.form = DraftDistributions::Form::kTopN;
        r.drafts.values = topn_values[i].View();
        r.drafts.token_ids = topn_ids[i];
      } else {
        r.drafts.form = DraftDistributions::Form::kDense;
        r.drafts.values = dense.RowsView(i * drafts, drafts);
      }
      step.requests.push_back(r);
    }
    return step;
  };
  const Step prefill = PrefillStep(logits, rows);
  const Step dense_step = decode_step(false);
  const Step topn_step = decode_step(true);
  int64_t accepted = 0;
  {
    auto plan = PlanStep(dense_step, Limits{}, RandomSeedSource());
    auto result = (*backend)->Sample(*plan);
    for (const auto& r : result->results) accepted += r.num_accepted;
  }
  const double t_prefill = MedianSeconds(7, [&] { RunOrDie(**backend, prefill); });
  const double t_dense = MedianSeconds(7, [&] { RunOrDie(**backend, dense_step); });
  const double t_topn = MedianSeconds(7, [&] { RunOrDie(**backend, topn_step); });
  std::printf("accepted drafts (dense): %lld of %d\n", static_cast<long long>(accepted),
              requests * drafts);
  std::printf("%-22s %10s %10s\n", "step", "ms", "vs prefill");
  std::printf("%-22s %10.2f %10s\n", "prefill 384 rows", t_prefill * 1e3, "1.00x");
  std::printf("%-22s %10.2f %9.3fx\n", "decode dense drafts", t_dense * 1e3, t_dense / t_prefill);
  std::printf("%-22s %10.2f %9.3fx\n", "decode top-N drafts", t_topn * 1e3, t_topn / t_prefill);
}

// DRY's cost (issue 33): R = 16 PREFILL rows, each request with a 4,096-token context, with
// and without DRY, measured alternately in this run (PlanStep + Sample: the host work DRY adds
// is in the planning of each row's updates).
void BenchDry() {
  std::printf("== DRY: R=16 prefill, V=%d, %d-token contexts, with and without DRY\n", kVocab,
              kBenchDryContext);
  const HostLogits logits(16, kVocab, /*seed=*/4, /*scale=*/2.0f);
  auto all = CpuBackend::Create({});
  Step plain = PrefillStep(logits, 16);
  for (size_t r = 0; r < plain.requests.size(); ++r) {
    plain.requests[r].prompt_token_ids = BenchDryContext(r);
  }
  Step dry = plain;
  for (RequestInputs& r : dry.requests) AddBenchDry(r.params);
  std::vector<double> plain_s, dry_s;
  for (int round = 0; round < 5; ++round) {
    plain_s.push_back(MedianSeconds(10, [&] { RunOrDie(**all, plain); }));
    dry_s.push_back(MedianSeconds(10, [&] { RunOrDie(**all, dry); }));
  }
  std::sort(plain_s.begin(), plain_s.end());
  std::sort(dry_s.begin(), dry_s.end());
  const double p = plain_s[plain_s.size() / 2], d = dry_s[dry_s.size() / 2];
  std::printf("step ms: without DRY %.3f, with DRY %.3f: %+.2f%% (medians of 5 rounds of 10)\n",
              p * 1e3, d * 1e3, 100.0 * (d / p - 1.0));
  // The host work alone: one row's entries from its 4,096-token context.
  TokenAdjustments adjustments;
  adjustments.dry.multiplier = 0.8f;
  adjustments.dry.breakers = {13, 198};
  const std::vector<int32_t> context = BenchDryContext(1);
  size_t entries = 0;
  const double row_s = MedianSeconds(2000, [&] {
    entries += RowTokenUpdates(adjustments, PenaltySettings{}, context, {}, {}).size();
  });
  std::printf("one row's DRY entries (RowTokenUpdates): %.2f us\n", row_s * 1e6);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (only.empty() || only == "prefill") samplerd::BenchPrefill();
  if (only.empty() || only == "decode") samplerd::BenchDecode();
  if (only.empty() || only == "dry") samplerd::BenchDry();
  return 0;
}
