// `samplerctl bench`: a load generator for a running samplerd. Each stream (a thread, with a
// connection of its own, as a separate model worker process would have) sends
// PREFILL steps of `rows` requests over V = `vocab` random fp32 logits, inline, through a
// registered shm region or through a registered CUDA IPC region (logits in this process's GPU
// memory, as a model worker's), unary or on one SampleStream, and records each step's latency.
//
//   ASSIGN_OR_RETURN(LoadReport report, RunLoad(options));
//   std::cout << FormatReport(options, report);
#ifndef SAMPLERD_CLIENT_LOAD_GENERATOR_H_
#define SAMPLERD_CLIENT_LOAD_GENERATOR_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/sampler_client.h"

namespace samplerd {

struct LoadOptions {
  std::string target = "127.0.0.1:50051";
  ClientOptions client;     // TLS and the like (each stream still gets its own connection)
  int streams = 1;
  int rows = 16;
  int vocab = 129280;
  int steps = 200;          // per stream, after `warmup` steps
  int warmup = 10;
  enum class Source { kInline, kShm, kCudaIpc };
  Source source = Source::kInline;
  bool streaming = false;   // SampleStream, else unary Sample
  bool channel = false;     // a co-located step channel (shared memory), over the others
  // With cuda_ipc logits: each step also writes its tokens into this process's GPU memory
  // (StepOutput, DeviceTokens); a stream waits for them on the device and every step's device
  // tokens are checked against its response (outside the timed part).
  bool device_tokens = false;
};

struct LoadReport {
  int64_t steps = 0;
  double seconds = 0;       // wall time of the measured steps
  double p50_us = 0, p99_us = 0, max_us = 0;
  double server_compute_p50_us = 0;  // the server's own compute_us (its backend)
  // Its parts (StepTiming): device time of the kernels (0 on the CPU backend); the backend's
  // host work around them (compute - kernel, per step); conversion and planning before it.
  double server_kernel_p50_us = 0, server_host_p50_us = 0, server_prepare_p50_us = 0;
  // The floor, measured in the same run on the same channel before the load: an empty unary
  // round trip (grpc.health.v1 Health/Check), as many calls as one stream's steps.
  double floor_p50_us = 0, floor_p99_us = 0;
  // Streaming runs: the same for a SampleStream round trip of an empty step (no requests,
  // one inline logit: the whole service path with nothing to sample).
  double stream_floor_p50_us = 0, stream_floor_p99_us = 0;
};

// Errors: the first failed call's status.
absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options);
// The --source names: "inline", "shm", "cuda_ipc"; ParseSource is nullopt for any other.
const char* SourceName(LoadOptions::Source source);
std::optional<LoadOptions::Source> ParseSource(const std::string& name);
std::string FormatReport(const LoadOptions& options, const LoadReport& report);

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_LOAD_GENERATOR_H_
