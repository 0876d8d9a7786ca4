// GPU benchmark of the CUDA backend (run on the GPU machine; prints figures, asserts nothing).
//
//   gpu_bench            # every configuration
//   gpu_bench --quick    # R <= 16 only;  gpu_bench --only=decode  # names containing "decode"
//
// Kernel time per step (CUDA events around the backend's launches; logits already on the
// device), median of 50 runs after 5 warm-ups, for V = 129,280, T = 0.7, top_p = 0.95,
// top_k = 50, top-5 logprobs: R = 1, 16 (PREFILL), 384 (DECODE, 64 x 6 rows, dense drafts) and
// 8192 (prompt logprobs), fp32 and bf16. Each as a fraction of the HBM bandwidth measured in
// the same run by a large device-to-device copy. "queued": the same kernel time with the step
// sent behind a producer's ready event, its launches queued before the logits are ready (as a
// worker's asynchronous loop sends it), so no launch latency falls between the events; the
// producer a 1 GiB memset ("queued") or a 300 us host function that touches no memory ("idle
// queued"). "chunks" and "stream": the split path's two kernels, each forced at every R.
// Where the default ran the streaming kernel, a line "stream kernel blocks ..." follows: its
// blocks' start, time and end (p0 / p10 / p50 / p90 / p100, us from the first block's start)
// and their mean end by how many blocks their SM ran (StageTimer::last_block_summary).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/sampling_launch.h"
#include "cuda/stage_timer.h"
#include "sampler/validate.h"
#include "sampler/dtype.h"
#include "bench/bench_params.h"
#include "sampler/test_util.h"

namespace samplerd {
namespace {

constexpr int32_t kVocab = kBenchVocab;

double CopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a, *b;
  SAMPLERD_CUDA_CHECK(cudaMalloc(&a, bytes));
  SAMPLERD_CUDA_CHECK(cudaMalloc(&b, bytes));
  SAMPLERD_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t s, e;
  cudaEventCreate(&s);
  cudaEventCreate(&e);
  std::vector<float> times;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(s);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e);
    cudaEventSynchronize(e);
    float ms;
    cudaEventElapsedTime(&ms, s, e);
    if (i >= 2) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (times[times.size() / 2] * 1e-3);  // read + write bytes per second
}

struct Config {
  std::string name;
  StepKind kind;
  int rows;
  DType dtype;
  bool adjust = false;  // each request carries AddBenchAdjustments' token adjustments
  std::string plain;    // with `adjust`: the configuration of the same step without them
};

double MedianKernelUs(CudaBackend& gpu, const Step& step) {
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{1}; });
  if (!plan.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(plan.status().message()).c_str());
    std::exit(1);
  }
  std::vector<double> us;
  for (int i = 0; i < 55; ++i) {
    auto result = gpu.Sample(*plan);
    if (!result.ok() || !result->results[0].status.ok()) {
      std::fprintf(stderr, "sample failed\n");
      std::exit(1);
    }
    if (i >= 5) us.push_back(result->kernel_us);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// `rows` PREFILL requests, request r sampling row r (seed r, position 100) with BenchParams(r);
// with `adjust`, AddBenchAdjustments' token adjustments too.
void AddBenchPrefillRequests(Step& step, int rows, bool adjust) {
  for (int r = 0; r < rows; ++r) {
    RequestInputs req = PrefillRequest("r" + std::to_string(r), r, r, 100);
    req.params = BenchParams(r);
    if (adjust) AddBenchAdjustments(req.params, req.output_token_ids, r);
    step.requests.push_back(req);
  }
}

// `logits` as `dtype`'s bytes: its own floats for fp32, else bf16 values converted into *half.
// Normal(0, scale) logits, row r from its own generator (seeded by seed and r), the rows
// spread over the host's cores: the same values whatever the thread count. (One generator
// for the whole tensor took ~45 s of the GPU machine's time at R = 8,192, once per run.)
HostLogits BenchLogits(int32_t rows, int32_t cols, uint64_t seed, float scale) {
  HostLogits logits(rows, cols);
  const int threads = static_cast<int>(std::max(1u, std::min(std::thread::hardware_concurrency(), 32u)));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int32_t r = t; r < rows; r += threads) {
        std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(r));
        std::normal_distribution<float> normal(0.0f, scale);
        float* row = logits.Row(r);
        for (int32_t c = 0; c < cols; ++c) row[c] = normal(rng);
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  return logits;
}

const void* HostBytes(const HostLogits& logits, DType dtype, std::vector<uint16_t>* half) {
  if (dtype == DType::kFloat32) return logits.values.data();
  half->resize(logits.values.size());
  for (size_t i = 0; i < half->size(); ++i) (*half)[i] = FloatToBFloat16(logits.values[i]);
  return half->data();
}

// A device copy of `bytes` host bytes (the caller frees it with cudaFree).
void* DeviceCopy(const void* host, size_t bytes) {
  void* device;
  SAMPLERD_CUDA_CHECK(cudaMalloc(&device, bytes));
  SAMPLERD_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
  return device;
}

// A step of `kind` over `logits` as copied to `device` (fp32: set the dtype after for another).
Step DeviceStep(StepKind kind, const HostLogits& logits, void* device) {
  Step step = MakeStep(kind, logits, kVocab);
  step.logits.data = device;
  step.logits.on_device = true;
  return step;
}

// `requests` DECODE requests of q rows each (request i reads rows i*q..), BenchParams, fixed
// drafts with the dense rows of `drafts` (q - 1 a request) as their distributions; with
// `adjust`, AddBenchAdjustments' token adjustments too.
void AddBenchDecodeRequests(Step& step, int requests, int q, const HostLogits& drafts,
                            bool adjust) {
  for (int i = 0; i < requests; ++i) {
    RequestInputs r;
    r.request_id = "r" + std::to_string(i);
    r.first_row = i * q;
    r.num_rows = q;
    r.sample_position = 100;
    r.params = BenchParams(i);
    if (adjust) AddBenchAdjustments(r.params, r.output_token_ids, i);
    for (int j = 0; j < q - 1; ++j) r.draft_token_ids.push_back((i * 7919 + j * 104729) % kVocab);
    r.drafts.form = DraftDistributions::Form::kDense;
    r.drafts.values = drafts.RowsView(i * (q - 1), q - 1);
    step.requests.push_back(r);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Sample() `steps` times after 5 unmeasured: the median kernel time, and the median wall time
// (planning excluded; Sample's host work, uploads and kernels) in *wall_us. `before(i)`, when
// given, runs first in step i's wall time. Exits if a request fails.
double MedianSample(CudaBackend& gpu, const Step& step, int steps,
                    const std::function<void(int)>& before, double* wall_us) {
  auto plan = PlanStep(step, Limits{}, [] { return uint64_t{1}; });
  if (!plan.ok()) std::exit(1);
  std::vector<double> kernel, wall;
  for (int i = 0; i < steps + 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (before) before(i);
    auto result = gpu.Sample(*plan);
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - start).count();
    if (!result.ok()) std::exit(1);
    for (const RequestResult& r : result->results) {
      if (!r.status.ok()) {
        std::fprintf(stderr, "%s\n", r.status.ToString().c_str());
        std::exit(1);
      }
    }
    if (i >= 5) {
      kernel.push_back(result->kernel_us);
      wall.push_back(us);
    }
  }
  *wall_us = Median(wall);
  return Median(kernel);
}

// FlashInfer's figures from bench/flashinfer_baseline (lines "path dtype R us"), run on the
// same GPU in the same call: the fastest path per (dtype, R).
struct FlashInferBest {
  std::string path;
  double us = 0.0;
};
std::map<std::pair<std::string, int>, FlashInferBest> ReadFlashInfer(const std::string& file) {
  std::map<std::pair<std::string, int>, FlashInferBest> best;
  std::ifstream in(file);
  std::string path, dtype;
  int rows;
  double us;
  while (in >> path >> dtype >> rows >> us) {
    auto [it, fresh] = best.try_emplace({dtype, rows}, FlashInferBest{path, us});
    if (!fresh && us < it->second.us) it->second = FlashInferBest{path, us};
  }
  return best;
}

int Main(int argc, char** argv) {
  bool quick = false;        // --quick: R <= 16 only
  std::string only;          // --only=TEXT: the configurations whose name contains TEXT (ncu)
  std::string flashinfer;    // --flashinfer=FILE: flashinfer_baseline's figures, side by side
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg.rfind("--only=", 0) == 0) {
      only = arg.substr(7);
    } else if (arg.rfind("--flashinfer=", 0) == 0) {
      flashinfer = arg.substr(13);
    } else {
      std::fprintf(stderr, "usage: gpu_bench [--quick] [--only=TEXT] [--flashinfer=FILE]\n");
      return 2;
    }
  }
  const auto flashinfer_best = flashinfer.empty() ? decltype(ReadFlashInfer("")){}
                                                  : ReadFlashInfer(flashinfer);
  CudaBackendOptions options;
  auto gpu = CudaBackend::Create(options);
  if (!gpu.ok()) {
    std::fprintf(stderr, "%s\n", std::string(gpu.status().message()).c_str());
    return 1;
  }
  const double bandwidth = CopyBandwidth();
  std::printf("device: %s\nD2D copy bandwidth (read+write): %.0f GB/s\n",
              (*gpu)->Info().device.c_str(), bandwidth / 1e9);
  const std::vector<Config> configs = {
      {"prefill R=1", StepKind::kPrefill, 1, DType::kFloat32},
      {"prefill R=16", StepKind::kPrefill, 16, DType::kFloat32},
      {"prefill R=384", StepKind::kPrefill, 384, DType::kFloat32},
      {"decode R=384 (64x6)", StepKind::kDecode, 384, DType::kFloat32},
      {"prompt R=8192", StepKind::kPrefill, 8192, DType::kFloat32},
      {"prefill R=1 bf16", StepKind::kPrefill, 1, DType::kBFloat16},
      {"prefill R=16 bf16", StepKind::kPrefill, 16, DType::kBFloat16},
      {"prefill R=384 bf16", StepKind::kPrefill, 384, DType::kBFloat16},
      {"decode R=384 bf16", StepKind::kDecode, 384, DType::kBFloat16},
      {"prompt R=8192 bf16", StepKind::kPrefill, 8192, DType::kBFloat16},
      // The cost of token adjustments: the same steps as "prefill R=16" and "decode R=384".
      {"prefill R=16 +adjust", StepKind::kPrefill, 16, DType::kFloat32, true, "prefill R=16"},
      {"decode R=384 +adjust", StepKind::kDecode, 384, DType::kFloat32, true,
       "decode R=384 (64x6)"},
  };
  // Issue 49's second figure: the same step queued behind a producer's ready event, as a
  // worker in the asynchronous loop sends it (its forward still running when samplerd
  // launches). The forward: a 1 GiB memset on another stream (~0.3 ms on an H200), which
  // outlasts Sample()'s host work for every R here but 8,192, so the step's copy and launches
  // are queued before the logits are ready and the events bracket no launch latency.
  const size_t forward_bytes = size_t{1} << 30;
  void* forward_buffer;
  SAMPLERD_CUDA_CHECK(cudaMalloc(&forward_buffer, forward_bytes));
  cudaStream_t producer;
  cudaEvent_t ready;
  SAMPLERD_CUDA_CHECK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  SAMPLERD_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  auto forward = [&](int i) {
    SAMPLERD_CUDA_CHECK(cudaMemsetAsync(forward_buffer, i, forward_bytes, producer));
    SAMPLERD_CUDA_CHECK(cudaEventRecord(ready, producer));
  };
  // A producer that touches no memory: a host function holding the producer's stream for
  // 300 us (the step's host work is queued meanwhile). The memset's figure ("queued") came out
  // slower than the plain one at R <= 16 on an H100 (33.0 against 23.3 us at R = 1); this one
  // ("idle queued") tells whether the memset's L2 traffic or the queued wait itself costs it.
  auto idle_forward = [&](int) {
    SAMPLERD_CUDA_CHECK(cudaLaunchHostFunc(
        producer, [](void*) { std::this_thread::sleep_for(std::chrono::microseconds(300)); },
        nullptr));
    SAMPLERD_CUDA_CHECK(cudaEventRecord(ready, producer));
  };
  struct Row {
    std::string name;
    double us, queued_us, floor_us;
    std::string dtype;
    int rows;
    std::string plain;  // Config::plain
  };
  std::vector<Row> rows_out;
  // Each R's logits, generated once for both dtypes (BenchLogits).
  std::map<int, HostLogits> logits_by_rows;
  std::printf("%-22s %12s %12s %14s %14s %10s %10s %12s %10s %10s\n", "config", "kernel us",
              "GB/s read", "% of copy BW", "fused-only us", "speedup", "queued us",
              "idle queued", "chunks us", "stream us");
  std::printf("(split stages: chunk 0 of row 0 from its start: load, reductions, threshold, "
              "collect, end; its row's finishing block: start, merged, end)\n");
  for (const Config& c : configs) {
    if (quick && c.rows > 16) continue;
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    auto cached = logits_by_rows.find(c.rows);
    if (cached == logits_by_rows.end()) {
      cached = logits_by_rows.emplace(c.rows, BenchLogits(c.rows, kVocab, 11, 2.0f)).first;
    }
    const HostLogits& logits = cached->second;
    const int elem = c.dtype == DType::kFloat32 ? 4 : 2;
    std::vector<uint16_t> half;
    const void* host = HostBytes(logits, c.dtype, &half);
    const size_t bytes = static_cast<size_t>(c.rows) * kVocab * elem;
    void* device = DeviceCopy(host, bytes);
    Step step = DeviceStep(c.kind, logits, device);
    step.logits.dtype = c.dtype;
    HostLogits drafts(1, 1);
    if (c.kind == StepKind::kDecode) {
      const int q = 6, requests = c.rows / q;
      drafts = HostLogits(requests * (q - 1), kVocab);
      std::fill(drafts.values.begin(), drafts.values.end(), -11.77f);  // ~uniform
      AddBenchDecodeRequests(step, requests, q, drafts, c.adjust);
    } else if (c.rows == 8192) {
      RequestInputs r = PrefillRequest("p", c.rows - 1, 1, c.rows);
      r.params = BenchParams(1);
      r.prompt_first_row = 0;
      for (int k = 0; k < c.rows - 1; ++k) r.prompt_targets.push_back((k * 31) % kVocab);
      step.requests.push_back(r);
    } else {
      AddBenchPrefillRequests(step, c.rows, c.adjust);
    }
    // The default (rows with a small top-k on the split path) and, in the same run, every row
    // on the fused path: the version before the split path, as the within-run baseline.
    const double us = MedianKernelUs(**gpu, step);
    (*gpu)->set_split_path(false);
    const double fused_us = MedianKernelUs(**gpu, step);
    (*gpu)->set_split_path(true);
    // The split path's two kernels on every R (the default picks by R): a block a chunk, and a
    // block a row streaming its chunks.
    (*gpu)->set_split_stream_rows(INT_MAX);
    const double chunk_us = MedianKernelUs(**gpu, step);
    (*gpu)->set_split_stream_rows(1);
    const double stream_us = MedianKernelUs(**gpu, step);
    (*gpu)->set_split_stream_rows(cuda::kSplitStreamRows);
    step.logits.ready_event = ready;
    double queued_wall_us;
    const double queued_us = MedianSample(**gpu, step, 50, forward, &queued_wall_us);
    const double idle_queued_us = MedianSample(**gpu, step, 50, idle_forward, &queued_wall_us);
    step.logits.ready_event = nullptr;
    auto timer = std::make_shared<cuda::StageTimer>();
    (*gpu)->set_launch_probe(timer);
    MedianKernelUs(**gpu, step);
    (*gpu)->set_launch_probe(nullptr);
    std::string stages;
    for (double t : timer->last_stage_us()) stages += absl::StrFormat(" %.1f", t);
    const double gbs = bytes / (us * 1e-6) / 1e9;
    std::printf("%-22s %12.1f %12.0f %13.1f%% %14.1f %9.2fx %10.1f %12.1f %10.1f %10.1f   split stages us:%s\n",
                c.name.c_str(), us, gbs, 100.0 * gbs * 1e9 / bandwidth, fused_us, fused_us / us,
                queued_us, idle_queued_us, chunk_us, stream_us, stages.c_str());
    if (!timer->last_block_summary().empty()) {
      std::printf("  stream kernel %s\n", timer->last_block_summary().c_str());
    }
    if (!timer->last_chunk_summary().empty()) {
      std::printf("  split job 0's %s\n", timer->last_chunk_summary().c_str());
    }
    rows_out.push_back({c.name, us, queued_us, bytes / bandwidth * 1e6,
                        c.dtype == DType::kFloat32 ? "fp32" : "bf16", c.rows, c.plain});
    cudaFree(device);
  }
  // DRY (issue 33): R = 16 PREFILL rows with 4,096-token contexts, with and without DRY,
  // alternately in this run. DRY's work is on the host (each row's updates, planned in Sample),
  // so both the kernels' time and Sample()'s wall time (host and device) are compared.
  if (only.empty() || only == "dry") {
    HostLogits logits(16, kVocab, 13, 2.0f);
    void* device = DeviceCopy(logits.values.data(), logits.values.size() * sizeof(float));
    Step plain = DeviceStep(StepKind::kPrefill, logits, device);
    AddBenchPrefillRequests(plain, 16, /*adjust=*/false);
    for (int r = 0; r < 16; ++r) plain.requests[r].prompt_token_ids = BenchDryContext(r);
    Step dry = plain;
    for (RequestInputs& r : dry.requests) AddBenchDry(r.params);
    auto median_of = [&](const Step& step, int steps, const std::function<void(int)>& before,
                         double* wall_us) {
      return MedianSample(**gpu, step, steps, before, wall_us);
    };
    // As a GPU worker sends a step (examples/hf_generate.py): right after queueing its forward
    // pass (`forward` above), with a ready event that samplerd's stream waits on; the host work
    // of Sample() (DRY's included) then runs while the forward does. The time is from queueing
    // the forward to the step's results.
    auto forward_then_step = [&](Step step) {
      step.logits.ready_event = ready;
      double wall_us;
      median_of(step, 50, forward, &wall_us);
      return wall_us;
    };
    std::vector<double> pk, dk, pw, dw, pf, df;
    for (int round = 0; round < 5; ++round) {
      double w;
      pk.push_back(median_of(plain, 100, nullptr, &w));
      pw.push_back(w);
      dk.push_back(median_of(dry, 100, nullptr, &w));
      dw.push_back(w);
      pf.push_back(forward_then_step(plain));
      df.push_back(forward_then_step(dry));
    }
    std::printf("DRY, prefill R=16, %d-token contexts (with vs without; medians of 5 rounds):\n"
                "  kernels %.1f vs %.1f us (%+.1f%%)\n"
                "  Sample() wall, logits ready: %.1f vs %.1f us (%+.1f%%)\n"
                "  forward (1 GiB memset) then step on its ready event: %.1f vs %.1f us "
                "(%+.1f%%)\n",
                kBenchDryContext, Median(dk), Median(pk), 100.0 * (Median(dk) / Median(pk) - 1.0),
                Median(dw), Median(pw), 100.0 * (Median(dw) / Median(pw) - 1.0), Median(df),
                Median(pf), 100.0 * (Median(df) / Median(pf) - 1.0));
    cudaFree(device);
  }
  // Issue 50's cost: PREFILL steps of R = 16 and 384 rows (fp32, V = kVocab, the benchmark's
  // parameters) with top-nσ (n = 1), with XTC (probability 1, threshold 0.1: every row's draw
  // fires), with RAW logprobs, each against the same step without, alternating over 5 rounds of
  // 50 steps, medians of the rounds (kernels; Sample()'s wall time beside).
  if (only.empty() || only == "issue50") {
    std::printf("\nissue 50 (prefill, fp32, T 0.7 top-k 50 top-p 0.95 top-5 logprobs; kernels us "
                "with vs without, Sample() wall us with vs without):\n");
    for (int rows : {16, 384}) {
      HostLogits logits(rows, kVocab, 17, 2.0f);
      void* device = DeviceCopy(logits.values.data(), logits.values.size() * sizeof(float));
      Step plain = DeviceStep(StepKind::kPrefill, logits, device);
      AddBenchPrefillRequests(plain, rows, /*adjust=*/false);
      const std::pair<const char*, std::function<void(SamplingParams&)>> variants[] = {
          {"top-nσ n=1", [](SamplingParams& p) { p.top_n_sigma = 1.0f; }},
          // Thousands kept: the fused path's candidates overflow, the general algorithm runs.
          {"top-nσ n=3", [](SamplingParams& p) { p.top_n_sigma = 3.0f; }},
          {"XTC p=1 t=0.1", [](SamplingParams& p) { p.xtc_probability = 1.0f; }},
          {"RAW logprobs", [](SamplingParams& p) { p.logprobs_mode = 1; }},
          // Rows of top_k > 64 (or none) take the fused path (a cluster per row): that path's
          // cost on this step, for reference.
          {"fused path", nullptr},
      };
      for (const auto& [name, apply] : variants) {
        Step with = plain;
        for (RequestInputs& r : with.requests) {
          if (apply) apply(r.params);
        }
        std::vector<double> pk, wk, pw, ww;
        for (int round = 0; round < 5; ++round) {
          double w;
          pk.push_back(MedianSample(**gpu, plain, 50, nullptr, &w));
          pw.push_back(w);
          if (!apply) (*gpu)->set_split_path(false);
          wk.push_back(MedianSample(**gpu, with, 50, nullptr, &w));
          (*gpu)->set_split_path(true);
          ww.push_back(w);
        }
        std::printf("  R=%-4d %-14s kernels %8.1f vs %8.1f us (%+7.1f%%)   wall %8.1f vs %8.1f us\n",
                    rows, name, Median(wk), Median(pk), 100.0 * (Median(wk) / Median(pk) - 1.0),
                    Median(ww), Median(pw));
      }
      cudaFree(device);
    }
  }
  // Device drafts (issue 47): DECODE steps of q = 6 rows a request (R = 6, 96, 384), fp32
  // logits on the device, dense fp32 drafts of q - 1 rows a request sent from the host (built
  // into q rows and uploaded by Sample) against the same tensor in device memory (read in
  // place after a check of every entry on the device). Kernels and Sample()'s wall time,
  // medians of 50 steps, alternating over 5 rounds, medians of the rounds.
  if (only.empty() || only == "drafts") {
    constexpr int q = 6;
    std::printf("\ndevice drafts (DECODE, q = %d, dense fp32; host drafts vs device drafts, "
                "medians of 5 rounds of 50):\n", q);
    for (const int requests : {1, 16, 64}) {
      const int R = requests * q;
      HostLogits logits(R, kVocab, 11, 2.0f);
      HostLogits drafts(requests * (q - 1), kVocab, 12, 2.0f);
      for (float& v : drafts.values) v = -11.77f;  // ~uniform over V
      void* device_logits = DeviceCopy(logits.values.data(), logits.values.size() * sizeof(float));
      void* device_drafts = DeviceCopy(drafts.values.data(), drafts.values.size() * sizeof(float));
      Step host = DeviceStep(StepKind::kDecode, logits, device_logits);
      AddBenchDecodeRequests(host, requests, q, drafts, /*adjust=*/false);
      Step device = host;
      for (RequestInputs& r : device.requests) {
        r.drafts.values.data = static_cast<const char*>(device_drafts) +
                               (static_cast<const char*>(r.drafts.values.data) -
                                reinterpret_cast<const char*>(drafts.values.data()));
        r.drafts.values.on_device = true;
      }
      std::vector<double> hk, dk, hw, dw;
      for (int round = 0; round < 5; ++round) {
        double w;
        hk.push_back(MedianSample(**gpu, host, 50, nullptr, &w));
        hw.push_back(w);
        dk.push_back(MedianSample(**gpu, device, 50, nullptr, &w));
        dw.push_back(w);
      }
      std::printf("  R=%-4d kernels %8.1f vs %8.1f us (%+.1f%%); Sample() wall %8.1f vs %8.1f us "
                  "(%+.1f%%)\n", R, Median(hk), Median(dk), 100.0 * (Median(dk) / Median(hk) - 1.0),
                  Median(hw), Median(dw), 100.0 * (Median(dw) / Median(hw) - 1.0));
      cudaFree(device_logits);
      cudaFree(device_drafts);
    }
  }
  // Device shards (issue 47): the same PREFILL step (BenchParams) from one device tensor and
  // from TP = 2 and TP = 4 equal column shards, each its own allocation, read in place (no
  // gather). Kernels, medians of 50 steps, alternating over 5 rounds, medians of the rounds.
  if (only.empty() || only == "shards") {
    std::printf("\ndevice shards (prefill, T 0.7 top-k 50 top-p 0.95 top-5 logprobs; kernels us, "
                "whole vs TP=2 vs TP=4 shards; medians of 5 rounds of 50):\n");
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (const int rows : {1, 16, 384, 2048}) {
        HostLogits logits(rows, kVocab, 19, 2.0f);
        const size_t elem = DTypeSize(dtype);
        std::vector<uint16_t> half;
        const char* bytes = static_cast<const char*>(HostBytes(logits, dtype, &half));
        void* device = DeviceCopy(bytes, logits.values.size() * elem);
        Step whole = DeviceStep(StepKind::kPrefill, logits, device);
        whole.logits.dtype = dtype;
        AddBenchPrefillRequests(whole, rows, /*adjust=*/false);
        std::vector<void*> held;
        auto sharded = [&](int tp) {
          Step step = whole;
          const int32_t per = kVocab / tp;
          for (int s = 0; s < tp; ++s) {
            const int32_t begin = s * per, n = s == tp - 1 ? kVocab - begin : per;
            std::vector<char> part(static_cast<size_t>(rows) * n * elem);
            for (int r = 0; r < rows; ++r) {
              std::memcpy(&part[static_cast<size_t>(r) * n * elem],
                          &bytes[(static_cast<size_t>(r) * kVocab + begin) * elem], n * elem);
            }
            held.push_back(DeviceCopy(part.data(), part.size()));
            step.logits.shards.push_back(LogitsShard{held.back(), n, begin, n, nullptr});
          }
          step.logits.data = step.logits.shards[0].data;
          return step;
        };
        const Step tp2 = sharded(2), tp4 = sharded(4);
        std::vector<double> w, t2, t4;
        for (int round = 0; round < 5; ++round) {
          double wall;
          w.push_back(MedianSample(**gpu, whole, 50, nullptr, &wall));
          t2.push_back(MedianSample(**gpu, tp2, 50, nullptr, &wall));
          t4.push_back(MedianSample(**gpu, tp4, 50, nullptr, &wall));
        }
        std::printf("  %-4s R=%-5d whole %8.1f  TP=2 %8.1f (%+5.1f%%)  TP=4 %8.1f (%+5.1f%%)\n",
                    dtype == DType::kFloat32 ? "fp32" : "bf16", rows, Median(w), Median(t2),
                    100.0 * (Median(t2) / Median(w) - 1.0), Median(t4),
                    100.0 * (Median(t4) / Median(w) - 1.0));
        for (void* p : held) cudaFree(p);
        cudaFree(device);
      }
    }
  }
  // Token adjustments against the same step without them, in this run.
  for (const Row& r : rows_out) {
    if (r.plain.empty()) continue;
    for (const Row& b : rows_out) {
      if (b.name != r.plain) continue;
      std::printf("token adjustments: %-22s %8.1f us vs %-22s %8.1f us: %+.1f%%\n",
                  r.name.c_str(), r.us, b.name.c_str(), b.us, 100.0 * (r.us / b.us - 1.0));
    }
  }
  // Side by side: the read floor (the logits' bytes at the copy bandwidth measured above) and
  // FlashInfer's fastest path on the same R and dtype (a token per row only; gpu_bench's logits).
  // "queued": the step behind a producer's ready event (above), its launches issued before the
  // logits exist.
  std::printf("\n%-22s %10s %10s %10s %8s %14s %-14s %8s\n", "config", "samplerd", "queued",
              "read floor", "x floor", "flashinfer us", "(path)", "fi / sd");
  for (const Row& r : rows_out) {
    const auto it = flashinfer_best.find({r.dtype, r.rows});
    const std::string fi = it == flashinfer_best.end()
                               ? absl::StrFormat("%14s %-14s %8s", "-", "", "-")
                               : absl::StrFormat("%14.1f %-14s %7.2fx", it->second.us,
                                                 it->second.path, it->second.us / r.us);
    std::printf("%-22s %10.1f %10.1f %10.1f %7.1fx %s\n", r.name.c_str(), r.us, r.queued_us,
                r.floor_us, r.us / r.floor_us, fi.c_str());
  }
  cudaEventDestroy(ready);
  cudaStreamDestroy(producer);
  cudaFree(forward_buffer);
  return 0;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) { return samplerd::Main(argc, argv); }
