#include "client/load_generator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client/device_logits.h"
#include "client/sampler_client.h"
#include "sampler/status_macros.h"

namespace samplerd {
namespace {

using Clock = std::chrono::steady_clock;

v1::SampleRequest MakeStep(const LoadOptions& options, int stream, int step) {
  v1::SampleRequest request;
  request.set_step_id(static_cast<uint64_t>(stream) << 32 | static_cast<uint32_t>(step));
  v1::SamplerInputs* inputs = request.mutable_inputs();
  inputs->set_kind(v1::PREFILL);
  inputs->set_vocab_size(options.vocab);
  for (int r = 0; r < options.rows; ++r) {
    v1::RequestInputs* req = inputs->add_requests();
    req->set_request_id(absl::StrCat("s", stream, "r", r));
    req->set_row(r);
    req->set_sample_position(100 + step);
    v1::SamplingParams* p = req->mutable_params();
    p->set_temperature(0.7f);
    p->set_top_p(0.95f);
    p->set_top_k(50);
    p->set_top_logprobs(5);
    p->set_seq_seed(static_cast<uint64_t>(stream) * 1000003 + r);
  }
  return request;
}

struct StreamResult {
  absl::Status status;
  std::vector<double> latencies_us;
  std::vector<v1::StepTiming> timings;  // the server's, per measured step
  Clock::time_point first, last;  // start of the first measured step, end of the last
};

// A step's device tokens equal its response's: a stream waits on the done word (as a worker's
// next forward would), then the area is read back.
absl::Status CheckDeviceTokens(const DeviceTokens& tokens, const v1::SampleResponse& response) {
  RETURN_IF_ERROR(tokens.Wait(nullptr));  // the legacy stream: the copy below is ordered after
  std::vector<int32_t> ids, accepted;
  RETURN_IF_ERROR(tokens.Read(&ids, &accepted));
  for (int i = 0; i < response.results_size(); ++i) {
    const v1::RequestResult& r = response.results(i);
    const int32_t want = r.status().code() == 0 && r.token_ids_size() > 0 ? r.token_ids(0) : -1;
    if (ids[static_cast<size_t>(i)] != want) {
      return absl::InternalError(absl::StrCat("step ", response.step_id(), ": request ", i,
                                              "'s device token ", ids[static_cast<size_t>(i)],
                                              " is not the response's ", want));
    }
  }
  return absl::OkStatus();
}

void RunStream(const LoadOptions& options, int index, SamplerClient& client, StreamResult& out) {
  const int64_t bytes = static_cast<int64_t>(options.rows) * options.vocab * 4;
  std::vector<float> logits(static_cast<size_t>(options.rows) * options.vocab);
  std::mt19937_64 rng(index);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& v : logits) v = normal(rng);
  std::unique_ptr<ShmBuffer> shm;
  std::unique_ptr<DeviceLogits> device;
  std::unique_ptr<DeviceTokens> tokens;
  const std::string buffer_name = absl::StrCat("bench-", getpid(), "-", index);
  using Source = LoadOptions::Source;
  if (options.source == Source::kCudaIpc) {
    auto created = DeviceLogits::Create(logits.data(), bytes, /*device=*/0);
    if (!created.ok()) {
      out.status = created.status();
      return;
    }
    device = std::move(*created);
    out.status = client.RegisterBuffer(device->RegisterRequest(buffer_name));
    if (!out.status.ok()) return;
    if (options.device_tokens) {
      auto made = DeviceTokens::Create(options.rows, 1, /*device=*/0);
      if (!made.ok()) {
        out.status = made.status();
        return;
      }
      tokens = std::move(*made);
      out.status = client.RegisterBuffer(tokens->RegisterRequest(buffer_name + "-tokens"));
      if (!out.status.ok()) return;
    }
  } else if (options.source == Source::kShm) {
    auto created = ShmBuffer::Create("/samplerd-" + buffer_name, bytes);
    if (!created.ok()) {
      out.status = created.status();
      return;
    }
    shm = std::move(*created);
    std::memcpy(shm->data(), logits.data(), bytes);
    out.status = client.RegisterShm(buffer_name, *shm);
    if (!out.status.ok()) return;
  }
  std::unique_ptr<SamplerClient::StepStream> stream;
  std::unique_ptr<SamplerClient::StepChannel> channel;
  if (options.channel) {
    auto opened = client.OpenChannel();
    if (!opened.ok()) {
      out.status = opened.status();
      return;
    }
    channel = std::move(*opened);
  } else if (options.streaming) {
    auto opened = client.OpenStream();
    if (!opened.ok()) {
      out.status = opened.status();
      return;
    }
    stream = std::move(*opened);
  }
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    v1::SampleRequest request = MakeStep(options, index, step);
    v1::Tensor* tensor = request.mutable_logits();
    tensor->set_dtype(v1::FLOAT32);
    tensor->set_rows(options.rows);
    tensor->set_cols(options.vocab);
    const Clock::time_point start = Clock::now();
    if (options.source != Source::kInline) {
      tensor->mutable_buffer()->set_name(buffer_name);
    } else {
      // The copy into the message is part of what inline logits cost.
      tensor->set_data(logits.data(), bytes);
    }
    if (tokens != nullptr) {
      *request.mutable_output() = tokens->Next(buffer_name + "-tokens", options.rows);
    }
    auto response = channel ? channel->Step(request)
                    : stream ? stream->Step(request)
                             : client.Sample(request);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (!response.ok()) {
      out.status = response.status();
      return;
    }
    if (response->has_error()) {
      out.status = absl::Status(static_cast<absl::StatusCode>(response->error().code()),
                                response->error().message());
      return;
    }
    if (tokens != nullptr) {
      out.status = CheckDeviceTokens(*tokens, *response);
      if (!out.status.ok()) return;
    }
    if (step == options.warmup) out.first = start;
    out.last = Clock::now();
    if (step >= options.warmup) {
      out.latencies_us.push_back(us);
      out.timings.push_back(response->timing());
    }
  }
  if (stream) out.status = stream->Close();
  if (tokens != nullptr && out.status.ok()) {
    out.status = client.UnregisterBuffer(buffer_name + "-tokens");
  }
  if (options.source != Source::kInline && out.status.ok()) {
    out.status = client.UnregisterBuffer(buffer_name);
  }
}

// Latencies in microseconds of `warmup + steps` calls of `call`, the warm-up ones left out.
absl::StatusOr<std::vector<double>> TimeCalls(const LoadOptions& options,
                                              const std::function<absl::Status(int)>& call) {
  std::vector<double> us;
  for (int i = 0; i < options.warmup + options.steps; ++i) {
    const Clock::time_point start = Clock::now();
    RETURN_IF_ERROR(call(i));
    if (i >= options.warmup) {
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
  }
  return us;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

const char* SourceName(LoadOptions::Source source) {
  switch (source) {
    case LoadOptions::Source::kShm:
      return "shm";
    case LoadOptions::Source::kCudaIpc:
      return "cuda_ipc";
    case LoadOptions::Source::kInline:
      break;
  }
  return "inline";
}

std::optional<LoadOptions::Source> ParseSource(const std::string& name) {
  using Source = LoadOptions::Source;
  for (Source source : {Source::kInline, Source::kShm, Source::kCudaIpc}) {
    if (name == SourceName(source)) return source;
  }
  return std::nullopt;
}

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options) {
  if (options.streams < 1 || options.rows < 1 || options.vocab < 1 || options.steps < 1) {
    return absl::InvalidArgumentError("streams, rows, vocab and steps must be >= 1");
  }
  auto client = SamplerClient::Connect(options.target, options.client);
  if (!client.ok()) return client.status();
  // The floor first: the smallest unary call the server answers, on the same channel.
  auto floor = TimeCalls(options, [&](int) { return (*client)->IsServing().status(); });
  if (!floor.ok()) return floor.status();
  std::vector<double> stream_floor;
  if (options.streaming) {
    auto stream = (*client)->OpenStream();
    if (!stream.ok()) return stream.status();
    // The smallest step the server answers: no requests, one logit (inline).
    v1::SampleRequest empty;
    empty.mutable_inputs()->set_kind(v1::PREFILL);
    empty.mutable_inputs()->set_vocab_size(1);
    v1::Tensor* one = empty.mutable_logits();
    one->set_dtype(v1::FLOAT32);
    one->set_rows(1);
    one->set_cols(1);
    one->set_data(std::string(4, '\0'));
    auto timed = TimeCalls(options, [&](int i) -> absl::Status {
      empty.set_step_id(static_cast<uint64_t>(i));
      auto response = (*stream)->Step(empty);
      if (!response.ok()) return response.status();
      if (response->has_error()) {
        return absl::InternalError(absl::StrCat("the stream floor's empty step failed: ",
                                                response->error().message()));
      }
      return absl::OkStatus();
    });
    if (!timed.ok()) return timed.status();
    stream_floor = std::move(*timed);
    RETURN_IF_ERROR((*stream)->Close());
  }
  std::vector<StreamResult> results(options.streams);
  std::vector<std::thread> threads;
  // Each stream is one model worker: a connection of its own (16 workers are 16 processes,
  // not 16 streams multiplexed on one connection).
  std::vector<std::unique_ptr<SamplerClient>> clients;
  ClientOptions own = options.client;
  own.own_connection = true;
  for (int s = 0; s < options.streams; ++s) {
    auto connected = SamplerClient::Connect(options.target, own);
    if (!connected.ok()) return connected.status();
    clients.push_back(std::move(*connected));
  }
  for (int s = 0; s < options.streams; ++s) {
    threads.emplace_back([&, s] { RunStream(options, s, *clients[s], results[s]); });
  }
  for (std::thread& t : threads) t.join();
  LoadReport report;
  std::vector<double> all, compute, kernel, host, prepare;
  Clock::time_point first = results[0].first, last = results[0].last;
  for (const StreamResult& r : results) {
    if (!r.status.ok()) return r.status;
    first = std::min(first, r.first);
    last = std::max(last, r.last);
    all.insert(all.end(), r.latencies_us.begin(), r.latencies_us.end());
    for (const v1::StepTiming& t : r.timings) {
      compute.push_back(static_cast<double>(t.compute_us()));
      kernel.push_back(static_cast<double>(t.kernel_us()));
      host.push_back(static_cast<double>(t.compute_us() - t.kernel_us()));
      prepare.push_back(static_cast<double>(t.prepare_us()));
    }
  }
  report.seconds = std::chrono::duration<double>(last - first).count();
  report.steps = static_cast<int64_t>(all.size());
  report.p50_us = Percentile(all, 0.50);
  report.p99_us = Percentile(all, 0.99);
  report.max_us = Percentile(all, 1.0);
  report.server_compute_p50_us = Percentile(compute, 0.50);
  report.server_kernel_p50_us = Percentile(kernel, 0.50);
  report.server_host_p50_us = Percentile(host, 0.50);
  report.server_prepare_p50_us = Percentile(prepare, 0.50);
  report.floor_p50_us = Percentile(*floor, 0.50);
  report.floor_p99_us = Percentile(*floor, 0.99);
  report.stream_floor_p50_us = Percentile(stream_floor, 0.50);
  report.stream_floor_p99_us = Percentile(stream_floor, 0.99);
  return report;
}

std::string FormatReport(const LoadOptions& options, const LoadReport& report) {
  return absl::StrFormat(
      "streams=%d rows=%d vocab=%d source=%s mode=%s steps=%d: %.1f steps/s, latency p50 %.0f us "
      "p99 %.0f us max %.0f us (server compute p50 %.0f us: kernels p50 %.0f, host around them "
      "p50 %.0f; prepare p50 %.0f us; outside compute p50 %.0f us); empty-gRPC floor p50 %.0f us "
      "p99 %.0f us%s\n",
      options.streams, options.rows, options.vocab, SourceName(options.source),
      options.channel ? "channel" : options.streaming ? "stream" : "unary", report.steps,
      report.steps / report.seconds,
      report.p50_us, report.p99_us, report.max_us, report.server_compute_p50_us,
      report.server_kernel_p50_us, report.server_host_p50_us, report.server_prepare_p50_us,
      report.p50_us - report.server_compute_p50_us, report.floor_p50_us, report.floor_p99_us,
      options.streaming ? absl::StrFormat("; empty-step stream floor p50 %.0f us p99 %.0f us",
                                          report.stream_floor_p50_us, report.stream_floor_p99_us)
                        : std::string());
}

}  // namespace samplerd
