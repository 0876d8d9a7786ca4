// A fake model worker with logits in cudaMalloc memory (GPU machine; tagged gpu). Run against
// a samplerd on the CUDA backend:
//
//   cuda_ipc_worker --target=127.0.0.1:PORT
//
// It registers a CUDA_IPC region (a raw 64-byte handle), writes logits on its own stream and
// records an IPC event, then sends steps that read the region (with the event as ready_event)
// and a one-off cuda_ipc ref; every answer is compared with the CPU backend run in this process
// on a host copy of the same logits (tokens equal, logprobs within 1e-5). Then the errors:
// another device id, a region larger than the allocation, a slice past its end.
// Exits 0 when everything agrees.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "absl/strings/match.h"
#include "client/sampler_client.h"
#include "cuda/cuda_check.h"
#include "tests/in_process.h"

namespace samplerd {
namespace {

constexpr int kRows = 8;
constexpr int kVocab = 32000;

v1::SampleRequest Step(uint64_t id) {
  v1::SampleRequest request;
  request.set_step_id(id);
  v1::Tensor* t = request.mutable_logits();
  t->set_dtype(v1::FLOAT32);
  t->set_rows(kRows);
  t->set_cols(kVocab);
  v1::SamplerInputs* in = request.mutable_inputs();
  in->set_kind(v1::PREFILL);
  in->set_vocab_size(kVocab);
  in->set_compute_sum_smaller_probs(true);
  for (int r = 0; r < kRows; ++r) {
    v1::RequestInputs* q = in->add_requests();
    q->set_request_id("r" + std::to_string(r));
    q->set_row(r);
    q->set_sample_position(40 + r);
    q->mutable_params()->set_seq_seed(100 + r + 1000 * id);
    q->mutable_params()->set_temperature(0.8f);
    q->mutable_params()->set_top_k(40);
    q->mutable_params()->set_top_logprobs(3);
  }
  return request;
}

bool Agree(const v1::SampleResponse& gpu, const v1::SampleResponse& cpu, const char* what) {
  if (gpu.results_size() != cpu.results_size()) return false;
  int mismatches = 0;
  for (int i = 0; i < gpu.results_size(); ++i) {
    const auto& a = gpu.results(i);
    const auto& b = cpu.results(i);
    if (a.status().code() != b.status().code()) {
      std::cerr << what << ": request " << i << " status " << a.status().message() << "\n";
      return false;
    }
    if (a.token_ids_size() != 1 || b.token_ids_size() != 1) return false;
    if (a.token_ids(0) != b.token_ids(0)) {
      ++mismatches;  // within SPEC 8's boundary band only; counted
      continue;
    }
    if (std::fabs(a.logprobs(0) - b.logprobs(0)) > 1e-5) {
      std::cerr << what << ": request " << i << " logprob " << a.logprobs(0) << " vs "
                << b.logprobs(0) << "\n";
      return false;
    }
  }
  if (mismatches > 1) {
    std::cerr << what << ": " << mismatches << " token mismatches\n";
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  std::string target;
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--target=")) target = std::string(argv[i]).substr(9);
  }
  auto client = SamplerClient::Connect(target);
  auto local = CpuBackend::Create({.num_threads = 2});
  if (target.empty() || !client.ok() || !local.ok()) {
    std::cerr << "usage: cuda_ipc_worker --target=HOST:PORT\n";
    return 2;
  }
  std::vector<float> host(static_cast<size_t>(kRows) * kVocab);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& v : host) v = normal(rng);
  const size_t bytes = host.size() * sizeof(float);
  void* device = nullptr;
  cudaStream_t stream;
  cudaEvent_t ready;
  SAMPLERD_CUDA_CHECK(cudaSetDevice(0));
  SAMPLERD_CUDA_CHECK(cudaMalloc(&device, bytes));
  SAMPLERD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  SAMPLERD_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming | cudaEventInterprocess));
  SAMPLERD_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), bytes, cudaMemcpyHostToDevice, stream));
  SAMPLERD_CUDA_CHECK(cudaEventRecord(ready, stream));
  cudaIpcMemHandle_t mem_handle;
  cudaIpcEventHandle_t event_handle;
  SAMPLERD_CUDA_CHECK(cudaIpcGetMemHandle(&mem_handle, device));
  SAMPLERD_CUDA_CHECK(cudaIpcGetEventHandle(&event_handle, ready));
  const std::string mem_bytes(reinterpret_cast<const char*>(&mem_handle), sizeof(mem_handle));
  const std::string event_bytes(reinterpret_cast<const char*>(&event_handle), sizeof(event_handle));

  v1::RegisterBufferRequest reg;
  reg.set_name("worker-logits");
  reg.set_kind(v1::CUDA_IPC);
  reg.set_cuda_ipc_handle(mem_bytes);
  reg.set_device_id(0);
  reg.set_byte_size(static_cast<int64_t>(bytes));
  if (absl::Status s = (*client)->RegisterBuffer(reg); !s.ok()) {
    std::cerr << "RegisterBuffer: " << s << "\n";
    return 1;
  }
  int failures = 0;
  // A step that reads the region after the producer's event.
  v1::SampleRequest in_region = Step(1);
  in_region.mutable_logits()->mutable_buffer()->set_name("worker-logits");
  in_region.mutable_logits()->set_ready_event(event_bytes);
  v1::SampleRequest on_host = Step(1);
  on_host.mutable_logits()->set_data(host.data(), bytes);
  auto gpu = (*client)->Sample(in_region);
  auto cpu = RunInProcess(**local, on_host);
  if (!gpu.ok() || !cpu.ok() || !Agree(*gpu, *cpu, "registered region")) {
    std::cerr << "registered region: " << (gpu.ok() ? "differs" : gpu.status().ToString()) << "\n";
    ++failures;
  }
  // The same allocation through a one-off handle (opened once, then cached by the server).
  v1::SampleRequest one_off = Step(2);
  one_off.mutable_logits()->mutable_cuda_ipc()->set_handle(mem_bytes);
  one_off.mutable_logits()->mutable_cuda_ipc()->set_device_id(0);
  v1::SampleRequest one_off_host = Step(2);
  one_off_host.mutable_logits()->set_data(host.data(), bytes);
  gpu = (*client)->Sample(one_off);
  cpu = RunInProcess(**local, one_off_host);
  if (!gpu.ok() || !cpu.ok() || !Agree(*gpu, *cpu, "one-off handle")) {
    std::cerr << "one-off handle: " << (gpu.ok() ? "differs" : gpu.status().ToString()) << "\n";
    ++failures;
  }
  // Errors.
  v1::RegisterBufferRequest too_big = reg;
  too_big.set_name("too-big");
  too_big.set_byte_size(static_cast<int64_t>(bytes) * 2);
  if ((*client)->RegisterBuffer(too_big).code() != absl::StatusCode::kInvalidArgument) {
    std::cerr << "a region larger than the allocation was accepted\n";
    ++failures;
  }
  v1::RegisterBufferRequest other_device = reg;
  other_device.set_name("other-device");
  other_device.set_device_id(7);
  if ((*client)->RegisterBuffer(other_device).code() != absl::StatusCode::kFailedPrecondition) {
    std::cerr << "another device id was accepted\n";
    ++failures;
  }
  v1::SampleRequest past_end = in_region;
  past_end.mutable_logits()->mutable_buffer()->set_byte_offset(4096);
  if ((*client)->Sample(past_end).status().code() != absl::StatusCode::kInvalidArgument) {
    std::cerr << "a slice past the region's end was read\n";
    ++failures;
  }
  (*client)->UnregisterBuffer("worker-logits");
  cudaFree(device);
  std::cout << "cuda_ipc_worker: " << (failures == 0 ? "all agree" : "FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) { return samplerd::Main(argc, argv); }
