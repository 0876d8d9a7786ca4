// The samplerd.v1.Sampler gRPC service: converts each call, runs the core, converts back.
//
//   SamplerService service(backend, registry, groups, metrics, options, seeds);
//   builder.RegisterService(&service);
//   ...
//   service.StartDraining();  // on SIGTERM: new steps are refused, accepted ones answered
//
// Steps are admitted up to options.max_queued_steps at a time; beyond that a call is answered
// RESOURCE_EXHAUSTED at once, so the backend's queue never holds gRPC threads without bound.
// A step naming a context-parallel group (group_id, or NCCL logits) takes the group's turn
// first, receives its NCCL logits, runs, and (group_id) broadcasts its packed results or its
// error before answering (server/group_registry.h).
#ifndef SAMPLERD_SERVER_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVER_SAMPLER_SERVICE_H_

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "sampler/backend.h"
#include "sampler/validate.h"
#include "server/access_policy.h"
#include "server/buffer_registry.h"
#include "server/channel_table.h"
#include "server/group_registry.h"
#include "server/grpc_status_util.h"
#include "server/metrics.h"
#include "server/owner_leases.h"
#include "server/periodic_task.h"
#include "server/peer_identity.h"
#include "server/step_channel.h"
#include "server/version.h"

namespace samplerd {

struct ServiceOptions {
  Limits limits;
  int max_queued_steps = 64;            // steps admitted at once (waiting or computing)
  int64_t max_message_bytes = 64 << 20; // reported by GetServerInfo
  MemoryBudget* request_memory = nullptr;  // bounds what conversion allocates; null = unbounded
  std::string version = SAMPLERD_VERSION;
  // How long a client's registrations outlive its last call (OwnerLeases); <= 0: until they
  // are unregistered or a stream of the client drops.
  absl::Duration registration_lease = absl::Seconds(5);
  // Which callers may change the server's state (server/access_policy.h); default: all.
  AccessPolicy access;
  // Who each connection samplerd accepted itself is (server/peer_identity.h); null: nobody's
  // uid is known (in-process tests), so scopes are client ids alone.
  PeerDirectory* peers = nullptr;
  // SampleStreams open at once: over all clients (below gRPC's --max_rpc_threads, so unary
  // calls, GetServerInfo and health always find a thread), and of one client (its scope).
  int max_open_streams = 240;
  int max_streams_per_client = 64;
  // Step channels open at once (each holds a thread): over all clients, and of one client.
  int max_step_channels = 64;
  int max_channels_per_client = 8;
  // Called with false when no new stream can be opened (max_open_streams reached), with true
  // once one can again: main turns health NOT_SERVING meanwhile.
  std::function<void(bool)> on_accepting_streams;
  // Called with the reason after each failed step that left the backend unable to run any
  // step again (Backend::Broken: a CUDA context lost to a sticky fault or its MPS server):
  // main (which acts on the first call only) drains and exits, so the pod restarts samplerd
  // with a new context.
  std::function<void(const absl::Status&)> on_backend_broken;
};

class SamplerService final : public v1::Sampler::Service {
 public:
  // Borrows everything; all must outlive the service.
  SamplerService(Backend& backend, BufferRegistry& registry, GroupRegistry& groups,
                 Metrics& metrics, const ServiceOptions& options, SeedSource seed_source);
  ~SamplerService() override;

  grpc::Status Sample(grpc::ServerContext* context, const v1::SampleRequest* request,
                      v1::SampleResponse* response) override;
  grpc::Status SampleStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SampleResponse, v1::SampleRequest>* stream) override;
  grpc::Status RegisterBuffer(grpc::ServerContext* context, const v1::RegisterBufferRequest* request,
                              v1::RegisterBufferResponse* response) override;
  grpc::Status UnregisterBuffer(grpc::ServerContext* context,
                                const v1::UnregisterBufferRequest* request,
                                v1::UnregisterBufferResponse* response) override;
  grpc::Status ListBuffers(grpc::ServerContext* context, const v1::ListBuffersRequest* request,
                           v1::ListBuffersResponse* response) override;
  grpc::Status CreateGroup(grpc::ServerContext* context, const v1::CreateGroupRequest* request,
                           v1::CreateGroupResponse* response) override;
  grpc::Status DestroyGroup(grpc::ServerContext* context, const v1::DestroyGroupRequest* request,
                            v1::DestroyGroupResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::GetServerInfoResponse* response) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status KeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest* request,
                         v1::KeepAliveResponse* response) override;
  grpc::Status OpenStepChannel(grpc::ServerContext* context,
                               const v1::OpenStepChannelRequest* request,
                               v1::OpenStepChannelResponse* response) override;

  // The calling client: its `samplerd-client-id` metadata, else its connection, under what the
  // transport says it is: its verified client certificate's identity, else its uid (the unix
  // socket's SO_PEERCRED, or a TCP client's socket owner on this host). So an id cannot reach
  // another certificate's or another user's drafts or registrations. It scopes the client's
  // draft pool entries, owns its registrations and step channels, and counts its streams.
  std::string ClientScope(const grpc::ServerContext& context) const;
  // The caller's uid where the transport can tell (see ClientScope), else nullopt.
  std::optional<uint32_t> PeerUid(const grpc::ServerContext& context) const;
  // The port of gRPC's own (TLS) listener, for PeerUid's look-up of a TLS client on this host.
  void SetTlsPort(int port) { tls_port_.store(port); }

  // From now on steps are refused with UNAVAILABLE; steps already admitted are answered.
  void StartDraining() { draining_.store(true); }
  // Ends the streams (CANCELLED) that wait for a step while draining: a worker that sent none
  // since the drain began (main waits --drain_idle_stream_ms first) would otherwise hold the
  // drain, and with it the next samplerd, until the shutdown deadline. A worker's step that
  // crosses the cancel is resent by its client to the next samplerd.
  void CancelIdleStreams();

  // Steps read from clients, and steps whose response was handed back to gRPC (answered,
  // with results or an error): equal once the server has drained.
  int64_t steps_read() const { return steps_read_.load(); }
  int64_t steps_answered() const { return steps_answered_.load(); }

 private:
  // OK when the caller may call `rpc` (options_.access); else its PERMISSION_DENIED, counted.
  absl::Status Guard(const grpc::ServerContext& context, absl::string_view rpc);
  // Every unary handler's prologue, once: the access guard for rpcs that change state
  // (`guarded`), the caller's scope (ClientScope), its lease renewed; then `body(scope)`, whose
  // absl::Status is the rpc's.
  template <typename Body>
  grpc::Status Handle(const grpc::ServerContext& context, absl::string_view rpc, bool guarded,
                      Body&& body) {
    if (guarded) {
      if (absl::Status denied = Guard(context, rpc); !denied.ok()) return ToGrpcStatus(denied);
    }
    const std::string scope = ClientScope(context);
    leases_.Touch(scope, absl::Now());
    return ToGrpcStatus(body(scope));
  }
  // One step, start to finish. Step-level faults are the returned status.
  // `privileged`: the caller may name registered buffers, groups and CUDA events (else
  // inline logits only; options_.access).
  absl::Status RunStep(const v1::SampleRequest& request, const std::string& pool_scope,
                       bool privileged, v1::SampleResponse* response);
  // A step as a stream or a channel answers it: counted, the caller's lease renewed, a
  // step-level fault written into the response's `error`.
  void AnswerStep(const v1::SampleRequest& request, const std::string& scope, bool privileged,
                  v1::SampleResponse* response);
  // The bodies of the handlers too long to read inside Handle's lambda.
  absl::Status RegisterBufferFor(const std::string& owner, grpc::ServerContext& context,
                                 const v1::RegisterBufferRequest& request,
                                 v1::RegisterBufferResponse* response);
  absl::Status CreateGroupFor(const v1::CreateGroupRequest& request,
                              v1::CreateGroupResponse* response);
  absl::Status OpenStepChannelFor(const std::string& owner, const grpc::ServerContext& context,
                                  const v1::OpenStepChannelRequest& request,
                                  v1::OpenStepChannelResponse* response);
  struct StepStats;
  // Admission, conversion (through `resolver`, which also holds the step's received NCCL
  // logits), planning and the backend: the step's results or its fault.
  absl::StatusOr<StepResult> ComputeStep(const v1::SampleRequest& request,
                                         const std::string& pool_scope,
                                         LogitsSourceResolver& resolver, StepStats* stats);

  // Constant after construction.
  Backend& backend_;
  BufferRegistry& registry_;
  GroupRegistry& groups_;
  Metrics& metrics_;
  const ServiceOptions options_;
  const SeedSource seed_source_;
  // Random per process (KeepAliveResponse.server_id): how clients see a restart.
  const std::string server_id_;

  std::atomic<bool> draining_{false};
  std::atomic<int64_t> steps_read_{0};
  std::atomic<int64_t> steps_answered_{0};
  std::atomic<int> admitted_{0};
  // At most backend_.max_concurrent_steps() steps are in the backend at once; the wait for
  // a slot is measurable (queue_us).
  absl::Mutex backend_mu_;
  int backend_busy_ ABSL_GUARDED_BY(backend_mu_) = 0;

  // Registrations belong to their client and end with it (issue 26): a dropped stream releases
  // them at once, the reaper thread those of owners whose lease ran out.
  void ReleaseOwner(const std::string& owner, const char* why);
  OwnerLeases leases_;
  // Co-located workers' step channels (server/channel_table.h): released with the owner's
  // registrations, dropped once their worker closed them.
  ChannelTable channels_;
  // How a HOST_SHM object (a region or a step channel) is opened for this caller: as its uid
  // (ShmOpenOptions::opener); PERMISSION_DENIED naming `field` when samplerd cannot tell it.
  absl::StatusOr<ShmOpenOptions> ShmOptionsFor(const grpc::ServerContext& context,
                                               absl::string_view field) const;
  // An open SampleStream's handler as a drain sees it: `idle` while it waits in Read for the
  // next step (CancelIdleStreams cancels those).
  struct StreamHandler {
    grpc::ServerContext* context;
    std::atomic<bool> idle{false};
  };
  // Open SampleStreams, in all (their handlers) and counted by client scope.
  absl::Mutex streams_mu_;
  absl::flat_hash_set<StreamHandler*> open_streams_ ABSL_GUARDED_BY(streams_mu_);
  absl::flat_hash_map<std::string, int> streams_by_client_ ABSL_GUARDED_BY(streams_mu_);
  // Takes a stream slot for `client` (`handler` is listed until EndStream), or says which
  // limit is reached.
  absl::Status AdmitStream(const std::string& client, StreamHandler* handler);
  void EndStream(const std::string& client, StreamHandler* handler);
  std::atomic<int> tls_port_{0};
  // Closes and logs the owner's channels (`why`: ReleaseOwner's reason), or with owner ""
  // those their workers closed.
  void DropChannels(const std::string& owner, const char* why);
  // Releases owners whose lease ran out, drops closed channels, expires drafts (null when
  // leases never expire).
  std::unique_ptr<PeriodicTask> reaper_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SAMPLER_SERVICE_H_
