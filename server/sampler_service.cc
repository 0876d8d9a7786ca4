#include "server/sampler_service.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "sampler/extent.h"
#include "sampler/group_packet.h"
#include "sampler/status_macros.h"
#include "server/group_turn.h"
#include "server/grpc_status_util.h"
#include "pipeline/proto_convert.h"
#include "pipeline/step_pipeline.h"

namespace samplerd {
namespace {

using Clock = std::chrono::steady_clock;

// 64 random bits as hex.
std::string RandomServerId() {
  std::random_device entropy;
  return absl::StrCat(absl::Hex(entropy(), absl::kZeroPad8), absl::Hex(entropy(), absl::kZeroPad8));
}

// gRPC metadata naming the client instance (a random id the client libraries send): the
// draft pool scope that survives reconnects and is shared by a worker's calls and streams.
constexpr char kClientIdMetadata[] = "samplerd-client-id";
// Trailing metadata of an ALREADY_EXISTS registration: milliseconds until the name's holder,
// alive by its lease alone, would be gone if it makes no call (the clients wait that long once
// and try again: a restarted worker's predecessor's name).
constexpr char kRetryAfterMetadata[] = "samplerd-retry-after-ms";

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

struct SamplerService::StepStats {
  Clock::time_point prepared, computed, done;
  float kernel_us = 0.0f;
  int64_t rows = 0;
  StepKind kind = StepKind::kPrefill;
};

SamplerService::SamplerService(Backend& backend, BufferRegistry& registry, GroupRegistry& groups,
                               Metrics& metrics, const ServiceOptions& options,
                               SeedSource seed_source)
    : backend_(backend),
      registry_(registry),
      groups_(groups),
      metrics_(metrics),
      options_(options),
      seed_source_(std::move(seed_source)),
      server_id_(RandomServerId()),
      leases_(options.registration_lease),
      channels_(options.max_step_channels, options.max_channels_per_client) {
  if (options_.registration_lease > absl::ZeroDuration()) {
    // Expired owners are released within a quarter of the lease (at most 250 ms) of expiring.
    const absl::Duration period =
        std::min(absl::Milliseconds(250), options_.registration_lease / 4);
    reaper_ = std::make_unique<PeriodicTask>(period, [this] {
      for (const std::string& owner : leases_.TakeExpired(absl::Now())) {
        ReleaseOwner(owner, "lease_expired");
      }
      DropChannels("", nullptr);
      // Expired drafts give their memory back now, not at the next step that stores some.
      backend_.draft_pool().Expire();
    });
  }
}

SamplerService::~SamplerService() {
  reaper_.reset();  // stops it at once; a run in progress finishes first
  // Before any member goes: a channel's thread runs steps through this service.
  channels_.Clear();
}

void SamplerService::DropChannels(const std::string& owner, const char* why) {
  const int dropped = owner.empty() ? channels_.DropClosed() : channels_.DropOwner(owner);
  if (dropped == 0) return;
  metrics_.SetStepChannels(channels_.Size());
  if (owner.empty()) {
    spdlog::info("dropped {} closed step channels", dropped);
  } else {
    spdlog::info("closed {} step channels of {}: {}", dropped, owner, why);
  }
}

void SamplerService::ReleaseOwner(const std::string& owner, const char* why) {
  DropChannels(owner, why);
  const BufferRegistry::Released released = registry_.ReleaseOwner(owner);
  leases_.Forget(owner);
  metrics_.SetTrackedClients(leases_.Tracked());
  metrics_.SetRegisteredBuffers(registry_.Size(), registry_.BytesHeld());
  if (released.regions + released.handles == 0) return;
  metrics_.CountReleasedBuffers(why, released.regions);
  spdlog::info("released {} buffers ({} bytes) and {} one-off handles of {}: {}",
               released.regions, released.bytes, released.handles, owner, why);
}

absl::Status SamplerService::RunStep(const v1::SampleRequest& request,
                                     const std::string& pool_scope, bool privileged,
                                     v1::SampleResponse* response) {
  const Clock::time_point start = Clock::now();
  if (draining_.load()) return absl::UnavailableError("samplerd is shutting down");
  // Before the group's turn: a caller outside the allowlist never takes a group's NCCL logits.
  if (!privileged && (!AccessPolicy::InlineOnly(request.logits()) || !request.group_id().empty())) {
    metrics_.CountError(absl::StatusCode::kPermissionDenied);
    return absl::PermissionDeniedError(
        "logits: this client (its certificate's identities are not in --tls_allowed_clients) "
        "may only sample with inline logits (data or values; no buffer, CUDA IPC, NCCL, ready "
        "event or group_id)");
  }
  // The step's group turn (server/group_turn.h): receives, compute and broadcast inside it.
  auto turn = GroupTurn::Take(groups_, request);
  if (!turn.ok()) {
    metrics_.CountError(turn.status().code());
    spdlog::warn("step {} failed: {}", request.step_id(), turn.status().ToString());
    return turn.status();
  }
  const absl::Status received = turn->Receive();
  const Clock::time_point received_at = Clock::now();
  StepStats stats;
  stats.prepared = stats.computed = stats.done = received_at;
  StepResolver resolver(registry_, pool_scope, *turn);
  absl::StatusOr<StepResult> result =
      received.ok() ? ComputeStep(request, pool_scope, resolver, &stats)
                    : absl::StatusOr<StepResult>(received);
  turn->Finish(request.step_id(), result);
  if (!result.ok()) {
    metrics_.CountError(result.status().code());
    spdlog::warn("step {} failed: {}", request.step_id(), result.status().ToString());
    if (absl::Status broken = backend_.Broken(); !broken.ok() && options_.on_backend_broken) {
      options_.on_backend_broken(broken);
    }
    return result.status();
  }
  ResultToProto(*result, response, request.packed_results());
  const Clock::time_point end = Clock::now();
  v1::StepTiming* timing = response->mutable_timing();
  timing->set_queue_us(Micros(stats.computed - start));
  timing->set_prepare_us(Micros(stats.prepared - received_at));
  timing->set_compute_us(Micros(stats.done - stats.computed));
  timing->set_kernel_us(static_cast<int64_t>(stats.kernel_us));
  timing->set_total_us(Micros(end - start));
  timing->set_group_us(turn->in_group() ? Micros(turn->time()) : 0);
  for (const RequestResult& r : result->results) {
    if (!r.status.ok()) {
      metrics_.CountError(r.status.code());
      spdlog::debug("step {} request '{}': {}", request.step_id(), r.request_id,
                    r.status.ToString());
    }
  }
  metrics_.ObserveStep(stats.kind, std::chrono::duration<double>(end - start).count(), stats.rows,
                       static_cast<int64_t>(result->results.size()));
  spdlog::debug("step {} {}: {} requests, queue {} us, compute {} us", request.step_id(),
                StepKindName(stats.kind), result->results.size(), timing->queue_us(),
                timing->compute_us());
  return absl::OkStatus();
}

absl::StatusOr<StepResult> SamplerService::ComputeStep(const v1::SampleRequest& request,
                                                       const std::string& pool_scope,
                                                       LogitsSourceResolver& resolver,
                                                       StepStats* stats) {
  Admission admission(admitted_, options_.max_queued_steps);
  if (!admission.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "samplerd is busy: ", options_.max_queued_steps, " steps are already queued"));
  }
  metrics_.AddInFlight(1);
  struct InFlight {
    Metrics& metrics;
    ~InFlight() { metrics.AddInFlight(-1); }
  } in_flight{metrics_};
  // The stats, and the wait for one of the backend's slots, between the pipeline's stages.
  class Observer final : public StepObserver {
   public:
    Observer(SamplerService& service, StepStats& stats) : service_(service), stats_(stats) {}
    void Planned(const ConvertedStep& converted, const StepPlan& plan) override {
      stats_.kind = converted.step.kind;
      for (size_t i = 0; i < plan.requests.size(); ++i) {
        if (!plan.requests[i].status.ok()) continue;
        stats_.rows += static_cast<int64_t>(plan.requests[i].sampled_rows.size() +
                                            converted.step.requests[i].prompt_targets.size());
      }
      stats_.prepared = Clock::now();
    }
    void BeforeSample() override {
      const int slots = std::max(1, service_.backend_.max_concurrent_steps());
      absl::MutexLock lock(&service_.backend_mu_);
      auto slot_free = [this, slots]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_.backend_mu_) {
        return service_.backend_busy_ < slots;
      };
      service_.backend_mu_.Await(absl::Condition(&slot_free));
      ++service_.backend_busy_;
      stats_.computed = Clock::now();
    }
    void AfterSample() override {
      stats_.done = Clock::now();
      absl::MutexLock lock(&service_.backend_mu_);
      --service_.backend_busy_;
    }

   private:
    SamplerService& service_;
    StepStats& stats_;
  } observer(*this, *stats);
  StepEnvironment env;
  env.resolver = &resolver;
  env.budget = options_.request_memory;
  env.limits = options_.limits;
  env.seeds = seed_source_;
  env.pool_scope = pool_scope;
  absl::StatusOr<StepResult> result = samplerd::RunStep(request, backend_, env, &observer);
  if (result.ok()) stats->kernel_us = result->kernel_us;
  return result;
}

absl::Status SamplerService::Guard(const grpc::ServerContext& context, absl::string_view rpc) {
  absl::Status status = options_.access.CheckPrivileged(context, rpc);
  if (!status.ok()) {
    metrics_.CountError(status.code());
    spdlog::warn("{} refused: {}", std::string(rpc), std::string(status.message()));
  }
  return status;
}

std::string SamplerService::ClientScope(const grpc::ServerContext& context) const {
  std::string transport = options_.access.ScopePrefix(context);  // "cert:<SAN>/" under mTLS
  PeerDirectory::Peer peer;
  if (options_.peers != nullptr) {
    peer = options_.peers->Find(context.peer());
  } else {
    peer.address = context.peer();
  }
  if (transport.empty() && peer.uid.has_value()) transport = absl::StrCat("uid:", *peer.uid, "/");
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClientIdMetadata);
  if (it != metadata.end() && !it->second.empty()) {
    const absl::string_view id(it->second.data(), it->second.size());
    return absl::StrCat(transport, "id:", id);
  }
  // No id: the connection is the client (a descriptor number is reused, its serial is not).
  if (peer.connection != 0) {
    return absl::StrCat(transport, "peer:", peer.address, "#", peer.connection);
  }
  return absl::StrCat(transport, "peer:", peer.address);
}

std::optional<uint32_t> SamplerService::PeerUid(const grpc::ServerContext& context) const {
  const std::string peer = context.peer();
  if (options_.peers != nullptr) {
    const PeerDirectory::Peer found = options_.peers->Find(peer);
    if (found.connection != 0) return found.uid;
  }
  const int port = tls_port_.load();
  if (port > 0) return PeerUidByAddress(peer, port);
  return std::nullopt;
}

absl::StatusOr<ShmOpenOptions> SamplerService::ShmOptionsFor(const grpc::ServerContext& context,
                                                             absl::string_view field) const {
  ShmOpenOptions shm = registry_.shm_options();
  if (options_.peers == nullptr) return shm;  // in-process: no transport identities at all
  shm.opener = PeerUid(context);
  if (!shm.opener.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": samplerd cannot tell which local user this client is (a client on another "
        "host, or one it cannot see), and registers shared memory only for a client whose uid "
        "it knows and who owns the object: connect over the unix socket or TCP from this host"));
  }
  return shm;
}

void SamplerService::CancelIdleStreams() {
  absl::MutexLock lock(&streams_mu_);
  // Under the lock: a handler leaves the set before its context goes. One that marks itself
  // idle after draining_ was set sees it before it reads (both seq_cst), and ends itself.
  for (StreamHandler* handler : open_streams_) {
    if (draining_.load() && handler->idle.load()) handler->context->TryCancel();
  }
}

absl::Status SamplerService::AdmitStream(const std::string& client, StreamHandler* handler) {
  absl::MutexLock lock(&streams_mu_);
  const int open = static_cast<int>(open_streams_.size());
  if (open >= options_.max_open_streams) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SampleStream: ", open, " streams are open, the server's limit "
        "(--max_open_streams); unary Sample still answers"));
  }
  int& mine = streams_by_client_[client];
  if (mine >= options_.max_streams_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "SampleStream: this client has ", mine, " streams open, the limit of one client "
        "(--max_streams_per_client)"));
  }
  ++mine;
  open_streams_.insert(handler);
  // Under the lock, so that the health transitions come in the order the counts change.
  if (open + 1 == options_.max_open_streams && options_.on_accepting_streams) {
    options_.on_accepting_streams(false);
  }
  return absl::OkStatus();
}

void SamplerService::EndStream(const std::string& client, StreamHandler* handler) {
  absl::MutexLock lock(&streams_mu_);
  const bool was_full = static_cast<int>(open_streams_.size()) == options_.max_open_streams;
  open_streams_.erase(handler);
  auto it = streams_by_client_.find(client);
  if (it != streams_by_client_.end() && --it->second <= 0) streams_by_client_.erase(it);
  if (was_full && options_.on_accepting_streams) {
    options_.on_accepting_streams(true);
  }
}

grpc::Status SamplerService::Sample(grpc::ServerContext* context, const v1::SampleRequest* request,
                                    v1::SampleResponse* response) {
  steps_read_.fetch_add(1);
  const grpc::Status status = Handle(*context, "Sample", false, [&](const std::string& client) {
    return RunStep(*request, client, options_.access.Privileged(*context), response);
  });
  steps_answered_.fetch_add(1);
  return status;
}

grpc::Status SamplerService::SampleStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::SampleResponse, v1::SampleRequest>* stream) {
  const std::string pool_scope = ClientScope(*context);
  StreamHandler handler{context};
  // A bounded number of streams, of all clients and of this one (each holds a thread): one
  // client cannot take every thread (issue 45).
  if (absl::Status admitted = AdmitStream(pool_scope, &handler); !admitted.ok()) {
    metrics_.CountError(admitted.code());
    spdlog::warn("{} refused: {}", pool_scope, std::string(admitted.message()));
    return ToGrpcStatus(admitted);
  }
  // While the stream is open its client is alive; a stream that drops (its client went away
  // without closing it: a killed worker) releases the client's registrations at once.
  leases_.StreamOpened(pool_scope, absl::Now());
  metrics_.AddOpenStreams(1);
  struct StreamEnd {
    SamplerService& service;
    const std::string& client;
    StreamHandler& handler;
    bool dropped = false;
    ~StreamEnd() {
      service.EndStream(client, &handler);
      service.metrics_.AddOpenStreams(-1);
      if (service.leases_.StreamEnded(client, dropped, absl::Now())) {
        service.ReleaseOwner(client, "stream_dropped");
      }
    }
  } stream_end{*this, pool_scope, handler};
  const grpc::Status drained(grpc::StatusCode::UNAVAILABLE,
                             "samplerd is shutting down; every step read was answered");
  const bool privileged = options_.access.Privileged(*context);
  v1::SampleRequest request;
  for (;;) {
    handler.idle.store(true);
    if (draining_.load()) return drained;  // a stream opened, or answered, while draining
    const bool read = stream->Read(&request);
    handler.idle.store(false);
    if (!read) break;
    v1::SampleResponse response;
    AnswerStep(request, pool_scope, privileged, &response);
    if (!stream->Write(response)) {
      stream_end.dropped = true;
      return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
    }
    if (draining_.load()) return drained;
  }
  if (context->IsCancelled()) {
    // Cancelled by the client (gone), or by CancelIdleStreams while it waited for a step: then
    // the client is not gone, samplerd is.
    stream_end.dropped = !draining_.load();
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  }
  return grpc::Status::OK;
}

grpc::Status SamplerService::RegisterBuffer(grpc::ServerContext* context,
                                            const v1::RegisterBufferRequest* request,
                                            v1::RegisterBufferResponse* response) {
  return Handle(*context, "RegisterBuffer", true, [&](const std::string& owner) {
    return RegisterBufferFor(owner, *context, *request, response);
  });
}

absl::Status SamplerService::RegisterBufferFor(const std::string& owner,
                                               grpc::ServerContext& context,
                                               const v1::RegisterBufferRequest& request,
                                               v1::RegisterBufferResponse* response) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<ShmOpenOptions> shm = registry_.shm_options();
  if (request.kind() == v1::HOST_SHM) shm = ShmOptionsFor(context, "shm_name");
  absl::StatusOr<v1::BufferInfo> registered =
      shm.ok() ? registry_.Register(request, owner, &*shm) : shm.status();
  if (registered.status().code() == absl::StatusCode::kAlreadyExists) {
    const std::string holder = registry_.OwnerOf(request.name());
    if (holder == owner) {
      // The same client registers the name again: its new region replaces the old (a worker
      // restarted under a stable client_id takes over its predecessor's names at once).
      (void)registry_.Unregister(request.name(), owner);
      registered = registry_.Register(request, owner, &*shm);
    } else if (!holder.empty() && !leases_.Alive(holder, absl::Now())) {
      // A name whose owner is gone (a restarted worker's predecessor, killed before its lease
      // ran out and not yet reaped) is taken over; one whose owner is alive stays its.
      ReleaseOwner(holder, "taken_over");
      registered = registry_.Register(request, owner, &*shm);
    }
  }
  metrics_.SetRegisteredBuffers(registry_.Size(), registry_.BytesHeld());
  if (registered.status().code() == absl::StatusCode::kAlreadyExists) {
    // Held by a client alive by its lease alone (no stream): perhaps a killed worker whose
    // replacement is registering now. Its lease's remaining time says when to try again.
    const std::optional<absl::Duration> left =
        leases_.LeaseLeft(registry_.OwnerOf(request.name()), absl::Now());
    if (left.has_value()) {
      context.AddTrailingMetadata(kRetryAfterMetadata,
                                   std::to_string(absl::ToInt64Milliseconds(*left) + 1));
    }
  }
  if (!registered.ok()) {
    spdlog::warn("RegisterBuffer '{}': {}", request.name(), registered.status().ToString());
    return registered.status();
  }
  // Tracked once it owns something: a failed call leaves no lease entry behind (issue 45).
  leases_.Track(owner, absl::Now());
  metrics_.SetTrackedClients(leases_.Tracked());
  response->set_server_id(server_id_);
  // Registration's cost (opening, mapping, pinning) is paid once, here: logged.
  std::string pinning;
  if (registered->pinned()) {
    pinning = ", pinned";
  } else if (!registered->pin_error().empty()) {
    pinning = ", not pinned: " + registered->pin_error();
  }
  spdlog::info("registered buffer '{}' ({} bytes, {}{}) for {} in {} us", request.name(),
               request.byte_size(), v1::BufferKind_Name(request.kind()), pinning, owner,
               Micros(Clock::now() - start));
  return absl::OkStatus();
}

grpc::Status SamplerService::UnregisterBuffer(grpc::ServerContext* context,
                                              const v1::UnregisterBufferRequest* request,
                                              v1::UnregisterBufferResponse*) {
  return Handle(*context, "UnregisterBuffer", true, [&](const std::string& owner) {
    const absl::Status status = registry_.Unregister(request->name(), owner);
    metrics_.SetRegisteredBuffers(registry_.Size(), registry_.BytesHeld());
    if (status.ok() && registry_.CountOwnedBy(owner) == 0 && channels_.Owned(owner) == 0) {
      leases_.Forget(owner);  // owns nothing any more: no lease entry to keep
      metrics_.SetTrackedClients(leases_.Tracked());
    }
    if (status.ok()) spdlog::info("unregistered buffer '{}'", request->name());
    return status;
  });
}

grpc::Status SamplerService::ListBuffers(grpc::ServerContext* context,
                                         const v1::ListBuffersRequest*,
                                         v1::ListBuffersResponse* response) {
  // A client sees its own regions only: owner ids are not public (issue 45).
  return Handle(*context, "ListBuffers", true, [&](const std::string& owner) {
    for (v1::BufferInfo& info : registry_.List(owner)) *response->add_buffers() = std::move(info);
    return absl::OkStatus();
  });
}

grpc::Status SamplerService::CreateGroup(grpc::ServerContext* context,
                                         const v1::CreateGroupRequest* request,
                                         v1::CreateGroupResponse* response) {
  return Handle(*context, "CreateGroup", true, [&](const std::string&) {
    return CreateGroupFor(*request, response);
  });
}

absl::Status SamplerService::CreateGroupFor(const v1::CreateGroupRequest& request,
                                            v1::CreateGroupResponse* response) {
  if (draining_.load()) return absl::UnavailableError("samplerd is shutting down");
  GroupConfig config;
  config.world_size = request.world_size();
  config.max_step_tokens = request.max_step_tokens();
  config.device_id = request.device_id();
  config.max_logits_bytes = request.max_logits_bytes();
  config.join_timeout = absl::Milliseconds(request.join_timeout_ms());
  config.op_timeout = absl::Milliseconds(request.op_timeout_ms());
  auto created = groups_.Create(config);
  if (!created.ok()) {
    spdlog::warn("CreateGroup: {}", created.status().ToString());
    return created.status();
  }
  response->set_group_id(created->group_id);
  response->set_nccl_unique_id(created->unique_id);
  response->set_packet_bytes(created->packet_bytes);
  response->set_layout_version(kGroupPacketVersion);
  return absl::OkStatus();
}

grpc::Status SamplerService::DestroyGroup(grpc::ServerContext* context,
                                          const v1::DestroyGroupRequest* request,
                                          v1::DestroyGroupResponse*) {
  return Handle(*context, "DestroyGroup", true,
                [&](const std::string&) { return groups_.Destroy(request->group_id()); });
}

grpc::Status SamplerService::GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                                           v1::GetServerInfoResponse* response) {
  const BackendInfo info = backend_.Info();
  response->set_version(options_.version);
  response->set_server_id(server_id_);
  response->set_backend(info.name);
  response->set_device(info.device);
  response->set_mps(info.mps);
  v1::ServerLimits* limits = response->mutable_limits();
  limits->set_max_rows(options_.limits.max_rows);
  limits->set_max_vocab_size(options_.limits.max_vocab_size);
  limits->set_max_top_logprobs(options_.limits.max_top_logprobs);
  limits->set_max_message_bytes(options_.max_message_bytes);
  limits->set_max_force_top_n(options_.limits.max_force_top_n);
  limits->set_max_token_list(options_.limits.max_token_list);
  if (options_.request_memory != nullptr) {
    limits->set_max_request_memory_bytes(options_.request_memory->capacity());
  }
  limits->set_draft_pool_bytes(backend_.draft_pool().CapacityBytes());
  limits->set_draft_pool_ttl_ms(absl::ToInt64Milliseconds(backend_.draft_pool().Ttl()));
  limits->set_max_groups(groups_.available() ? groups_.max_groups() : 0);
  limits->set_max_group_logits_bytes(groups_.available() ? groups_.max_logits_bytes() : 0);
  for (const GroupInfo& group : groups_.List()) {
    v1::GroupInfo* out = response->add_groups();
    out->set_group_id(group.group_id);
    out->set_state(group.state == GroupState::kJoining ? v1::JOINING
                   : group.state == GroupState::kReady ? v1::READY
                                                        : v1::FAILED);
    out->set_world_size(group.config.world_size);
    out->set_max_step_tokens(group.config.max_step_tokens);
    out->set_device_id(group.config.device_id);
    out->set_max_logits_bytes(group.config.max_logits_bytes);
    out->set_join_timeout_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(group.config.join_timeout)));
    out->set_op_timeout_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(group.config.op_timeout)));
    out->set_steps(group.steps);
    out->set_error(group.error);
  }
  for (const char* feature :
       {"prefill", "decode", "draft", "draft_pool", "prompt_logprobs", "grammar_masks",
        "penalties", "force_top_n", "sum_smaller_probs", "golden_tokens", "inline_logits",
        "host_shm", "shards", "bf16", "fp16", "release", "token_adjustments",
        "registration_leases", "dry", "request_batch", "packed_results", "top_n_sigma", "xtc",
        "raw_logprobs"}) {
    response->add_features(feature);
  }
  if (info.mps) response->add_features("mps");
  if (info.name == "cuda") {
    response->add_features("step_output");    // tokens into GPU memory
    response->add_features("device_drafts");  // draft tensors read in place (issue 47)
  }
  if (groups_.available()) {
    response->add_features("cp_groups");
    response->add_features("nccl_logits");
  }
  return grpc::Status::OK;
}

grpc::Status SamplerService::Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                                     v1::ReleaseResponse* response) {
  return Handle(*context, "Release", false, [&](const std::string& scope) {
    int released = 0;
    for (const std::string& id : request->request_ids()) {
      released += backend_.draft_pool().Release(DraftPoolKey(scope, id));
    }
    response->set_released_rows(released);
    return absl::OkStatus();
  });
}

void SamplerService::AnswerStep(const v1::SampleRequest& request, const std::string& scope,
                                bool privileged, v1::SampleResponse* response) {
  steps_read_.fetch_add(1);
  leases_.Touch(scope, absl::Now());
  const absl::Status status = RunStep(request, scope, privileged, response);
  if (!status.ok()) {
    // One bad step fails only itself: answer it with its error and keep the stream.
    response->Clear();
    response->set_step_id(request.step_id());
    response->mutable_error()->set_code(static_cast<int32_t>(status.code()));
    response->mutable_error()->set_message(std::string(status.message()));
  }
  // Handed back (to gRPC, or written into the channel), whether or not the client listens.
  steps_answered_.fetch_add(1);
}

grpc::Status SamplerService::OpenStepChannel(grpc::ServerContext* context,
                                             const v1::OpenStepChannelRequest* request,
                                             v1::OpenStepChannelResponse* response) {
  return Handle(*context, "OpenStepChannel", true, [&](const std::string& owner) {
    return OpenStepChannelFor(owner, *context, *request, response);
  });
}

absl::Status SamplerService::OpenStepChannelFor(const std::string& owner,
                                                const grpc::ServerContext& context,
                                                const v1::OpenStepChannelRequest& request,
                                                v1::OpenStepChannelResponse* response) {
  if (draining_.load()) return absl::UnavailableError("samplerd is shutting down");
  if (request.capacity_bytes() > options_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("capacity_bytes: ", request.capacity_bytes(),
                                                   " exceeds the server's max_message_bytes of ",
                                                   options_.max_message_bytes));
  }
  absl::StatusOr<ShmOpenOptions> shm = ShmOptionsFor(context, "shm_name");
  if (!shm.ok()) return shm.status();
  DropChannels("", nullptr);  // those their workers closed
  RETURN_IF_ERROR(channels_.Reserve(owner));  // the limits, concurrent opens included
  auto channel = StepChannel::Open(
      request.shm_name(), request.capacity_bytes(), *shm,
      [this, owner](const v1::SampleRequest& step, v1::SampleResponse* answer) {
        AnswerStep(step, owner, /*privileged=*/true, answer);  // opening it was guarded
      });
  if (!channel.ok()) channels_.Cancel(owner);
  if (!channel.ok()) {
    spdlog::warn("OpenStepChannel '{}': {}", request.shm_name(), channel.status().ToString());
    return channel.status();
  }
  const std::string id = channels_.Add(owner, *std::move(channel));
  metrics_.SetStepChannels(channels_.Size());
  leases_.Track(owner, absl::Now());  // only once it owns the channel (issue 45)
  metrics_.SetTrackedClients(leases_.Tracked());
  spdlog::info("opened step channel {} on '{}' ({} bytes a direction) for {}", id,
               request.shm_name(), request.capacity_bytes(), owner);
  response->set_channel_id(id);
  response->set_server_id(server_id_);
  return absl::OkStatus();
}

grpc::Status SamplerService::KeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest*,
                                       v1::KeepAliveResponse* response) {
  return Handle(*context, "KeepAlive", false, [&](const std::string& client) {
    response->set_lease_ms(absl::ToInt64Milliseconds(options_.registration_lease));
    response->set_buffers(registry_.CountOwnedBy(client));
    response->set_server_id(server_id_);
    return absl::OkStatus();
  });
}

}  // namespace samplerd
