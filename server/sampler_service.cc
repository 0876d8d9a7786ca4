#include "server/sampler_service.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/grpc_status_util.h"
#include "server/proto_convert.h"

namespace samplerd {
namespace {

using Clock = std::chrono::steady_clock;

// gRPC metadata naming the client instance (a random id the client libraries send): the
// draft pool scope that survives reconnects and is shared by a worker's calls and streams.
constexpr char kClientIdMetadata[] = "samplerd-client-id";

int64_t Micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

// Holds one of the service's admission slots for a step.
class Admission {
 public:
  Admission(std::atomic<int>& admitted, int limit) : admitted_(admitted) {
    ok_ = admitted_.fetch_add(1) < limit;
  }
  ~Admission() { admitted_.fetch_sub(1); }
  bool ok() const { return ok_; }

 private:
  std::atomic<int>& admitted_;
  bool ok_;
};

}  // namespace

SamplerService::SamplerService(Backend& backend, BufferRegistry& registry, Metrics& metrics,
                               const ServiceOptions& options, SeedSource seed_source)
    : backend_(backend),
      registry_(registry),
      metrics_(metrics),
      options_(options),
      seed_source_(std::move(seed_source)) {}

absl::Status SamplerService::RunStep(const v1::SampleRequest& request,
                                     const std::string& pool_scope,
                                     v1::SampleResponse* response) {
  const Clock::time_point start = Clock::now();
  if (draining_.load()) return absl::UnavailableError("samplerd is shutting down");
  Admission admission(admitted_, options_.max_queued_steps);
  if (!admission.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "samplerd is busy: ", options_.max_queued_steps, " steps are already queued"));
  }
  metrics_.AddInFlight(1);
  auto converted = StepFromProto(request, &registry_, options_.request_memory);
  if (converted.ok()) (*converted)->step.pool_scope = pool_scope;
  absl::StatusOr<StepResult> result;
  Clock::time_point computed = start, done = start;
  int64_t rows = 0;  // logits rows the step samples or reads for prompt logprobs
  if (converted.ok()) {
    auto plan = PlanConvertedStep(**converted, options_.limits, seed_source_);
    if (plan.ok()) {
      for (size_t i = 0; i < plan->requests.size(); ++i) {
        if (!plan->requests[i].status.ok()) continue;
        rows += static_cast<int64_t>(plan->requests[i].sampled_rows.size() +
                                     (*converted)->step.requests[i].prompt_targets.size());
      }
      absl::MutexLock lock(&backend_mu_);
      computed = Clock::now();
      result = backend_.Sample(*plan);
      done = Clock::now();
      // A registered shm object truncated while the backend read it: its answers rest on
      // zero pages, so the step fails (the SIGBUS handler kept the server alive).
      if (result.ok()) {
        if (absl::Status intact = (*converted)->VerifyAfterRead(); !intact.ok()) result = intact;
      }
    } else {
      result = plan.status();
    }
  } else {
    result = converted.status();
  }
  metrics_.AddInFlight(-1);
  if (!result.ok()) {
    metrics_.CountError(result.status().code());
    spdlog::warn("step {} failed: {}", request.step_id(), result.status().ToString());
    return result.status();
  }
  ResultToProto(*result, response);
  const Clock::time_point end = Clock::now();
  v1::StepTiming* timing = response->mutable_timing();
  timing->set_queue_us(Micros(computed - start));
  timing->set_compute_us(Micros(done - computed));
  timing->set_total_us(Micros(end - start));
  for (const RequestResult& r : result->results) {
    if (!r.status.ok()) {
      metrics_.CountError(r.status.code());
      spdlog::debug("step {} request '{}': {}", request.step_id(), r.request_id,
                    r.status.ToString());
    }
  }
  metrics_.ObserveStep((*converted)->step.kind, std::chrono::duration<double>(end - start).count(),
                       rows, static_cast<int64_t>(result->results.size()));
  spdlog::debug("step {} {}: {} requests, queue {} us, compute {} us", request.step_id(),
                StepKindName((*converted)->step.kind), result->results.size(), timing->queue_us(),
                timing->compute_us());
  return absl::OkStatus();
}

std::string SamplerService::PoolScope(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClientIdMetadata);
  if (it != metadata.end() && !it->second.empty()) {
    return absl::StrCat("id:", absl::string_view(it->second.data(), it->second.size()));
  }
  return absl::StrCat("peer:", context.peer());
}

grpc::Status SamplerService::Sample(grpc::ServerContext* context, const v1::SampleRequest* request,
                                    v1::SampleResponse* response) {
  steps_read_.fetch_add(1);
  const grpc::Status status = ToGrpcStatus(RunStep(*request, PoolScope(*context), response));
  steps_answered_.fetch_add(1);
  return status;
}

grpc::Status SamplerService::SampleStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::SampleResponse, v1::SampleRequest>* stream) {
  const std::string pool_scope = PoolScope(*context);
  v1::SampleRequest request;
  while (stream->Read(&request)) {
    steps_read_.fetch_add(1);
    v1::SampleResponse response;
    const absl::Status status = RunStep(request, pool_scope, &response);
    if (!status.ok()) {
      // One bad step fails only itself: answer it with its error and keep the stream.
      response.Clear();
      response.set_step_id(request.step_id());
      response.mutable_error()->set_code(static_cast<int32_t>(status.code()));
      response.mutable_error()->set_message(std::string(status.message()));
    }
    const bool written = stream->Write(response);
    steps_answered_.fetch_add(1);  // handed to gRPC, whether or not the client still listens
    if (!written) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    if (draining_.load()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "samplerd is shutting down; every step read was answered");
    }
  }
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  return grpc::Status::OK;
}

grpc::Status SamplerService::RegisterBuffer(grpc::ServerContext*,
                                            const v1::RegisterBufferRequest* request,
                                            v1::RegisterBufferResponse*) {
  const absl::Status status = registry_.Register(*request);
  metrics_.SetRegisteredBuffers(registry_.Size());
  if (status.ok()) {
    spdlog::info("registered buffer '{}' ({} bytes, {})", request->name(), request->byte_size(),
                 v1::BufferKind_Name(request->kind()));
  } else {
    spdlog::warn("RegisterBuffer '{}': {}", request->name(), status.ToString());
  }
  return ToGrpcStatus(status);
}

grpc::Status SamplerService::UnregisterBuffer(grpc::ServerContext*,
                                              const v1::UnregisterBufferRequest* request,
                                              v1::UnregisterBufferResponse*) {
  const absl::Status status = registry_.Unregister(request->name());
  metrics_.SetRegisteredBuffers(registry_.Size());
  if (status.ok()) spdlog::info("unregistered buffer '{}'", request->name());
  return ToGrpcStatus(status);
}

grpc::Status SamplerService::ListBuffers(grpc::ServerContext*, const v1::ListBuffersRequest*,
                                         v1::ListBuffersResponse* response) {
  for (v1::BufferInfo& info : registry_.List()) *response->add_buffers() = std::move(info);
  return grpc::Status::OK;
}

grpc::Status SamplerService::CreateGroup(grpc::ServerContext*, const v1::CreateGroupRequest*,
                                         v1::CreateGroupResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      "CreateGroup: context-parallel NCCL groups are not built yet");
}

grpc::Status SamplerService::DestroyGroup(grpc::ServerContext*, const v1::DestroyGroupRequest*,
                                          v1::DestroyGroupResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      "DestroyGroup: context-parallel NCCL groups are not built yet");
}

grpc::Status SamplerService::GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                                           v1::GetServerInfoResponse* response) {
  const BackendInfo info = backend_.Info();
  response->set_version(options_.version);
  response->set_backend(info.name);
  response->set_device(info.device);
  v1::ServerLimits* limits = response->mutable_limits();
  limits->set_max_rows(options_.limits.max_rows);
  limits->set_max_vocab_size(options_.limits.max_vocab_size);
  limits->set_max_top_logprobs(options_.limits.max_top_logprobs);
  limits->set_max_message_bytes(options_.max_message_bytes);
  limits->set_max_force_top_n(options_.limits.max_force_top_n);
  if (options_.request_memory != nullptr) {
    limits->set_max_request_memory_bytes(options_.request_memory->capacity());
  }
  limits->set_draft_pool_bytes(backend_.draft_pool().CapacityBytes());
  limits->set_draft_pool_ttl_ms(absl::ToInt64Milliseconds(backend_.draft_pool().Ttl()));
  for (const char* feature :
       {"prefill", "decode", "draft", "draft_pool", "prompt_logprobs", "grammar_masks",
        "penalties", "force_top_n", "sum_smaller_probs", "golden_tokens", "inline_logits",
        "host_shm", "shards", "bf16", "fp16", "release"}) {
    response->add_features(feature);
  }
  return grpc::Status::OK;
}

grpc::Status SamplerService::Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                                     v1::ReleaseResponse* response) {
  const std::string scope = PoolScope(*context);
  int released = 0;
  for (const std::string& id : request->request_ids()) {
    released += backend_.draft_pool().Release(DraftPoolKey(scope, id));
  }
  response->set_released_rows(released);
  return grpc::Status::OK;
}

}  // namespace samplerd
