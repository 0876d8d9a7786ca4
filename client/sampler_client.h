// SamplerClient: the C++ client of samplerd (unary steps, a model worker's streaming session,
// buffer registration, server info and health). Depends on the generated protos only.
//
//   ASSIGN_OR_RETURN(auto client, SamplerClient::Connect("127.0.0.1:50051"));
//   ASSIGN_OR_RETURN(v1::SampleResponse response, client->Sample(request));
//
//   ASSIGN_OR_RETURN(auto stream, client->OpenStream());
//   for (...) { ASSIGN_OR_RETURN(v1::SampleResponse r, stream->Step(request)); }
//   RETURN_IF_ERROR(stream->Close());
//
// Errors are the call's gRPC status as absl::Status (same code and message). Thread-safe,
// except that one StepStream must be used by one thread at a time.
//
// samplerd restarts under a live client (a sidecar restart, a rollout) are survived without
// the caller's help: a step that finds samplerd gone waits for it (reconnect_timeout),
// registers this client's regions again (shm ones under a fresh name: ShmBuffer::Relink) and
// is resent on a new stream, with every other step of the stream that had no answer yet. A
// resent step's answer is the one the lost one would have been (sampling is a function of the
// step); what samplerd held between steps is lost with it: a request that reads pooled drafts
// fails alone, with the pool's error. The keep-alive thread notices a restart between steps
// (KeepAliveResponse.server_id) and the next call registers again before it is sent.
#ifndef SAMPLERD_CLIENT_SAMPLER_CLIENT_H_
#define SAMPLERD_CLIENT_SAMPLER_CLIENT_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/shm_buffer.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "samplerd/v1/sampler.grpc.pb.h"

namespace samplerd {

struct ClientOptions {
  int64_t max_message_bytes = 256LL << 20;  // as the server's default
  std::chrono::milliseconds timeout{30000}; // per unary call
  // A connection of this client's own, never shared with other clients of the same target
  // in the process (gRPC shares one by default): as separate worker processes would have.
  bool own_connection = false;
  // How long a call that found samplerd gone (UNAVAILABLE: a sidecar restart or rollout) waits
  // for it to come back before failing; 0: fail at once. A client that waits registers its
  // regions again with the new samplerd and resends the steps it had no answer for. 0 also
  // turns the rest of that recovery off: the caller then handles restarts itself.
  std::chrono::milliseconds reconnect_timeout{30000};
  // TLS (a samplerd serving --tls_cert_file): the CA bundle that verifies samplerd's
  // certificate (PEM file; all three empty = plaintext), and for mutual TLS this client's
  // certificate chain and private key. `tls_server_name`: the name the certificate must carry,
  // when it is not the target's host (e.g. "samplerd.llm.svc" reached as 10.0.0.7:50051).
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
};

class SamplerClient final {
 public:
  // `target` is a gRPC target: "host:port" or "unix:/path". Connects lazily.
  static absl::StatusOr<std::unique_ptr<SamplerClient>> Connect(const std::string& target,
                                                                const ClientOptions& options = {});

  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request);

  // A SampleStream session: one response per step, in order.
  class StepStream {
   public:
    // Sends `request` and waits for its response. A step the server failed as a whole comes
    // back with `error` set; the stream goes on.
    absl::StatusOr<v1::SampleResponse> Step(const v1::SampleRequest& request);
    // Pipelined use: Send several, then Receive as many.
    absl::Status Send(const v1::SampleRequest& request);
    absl::StatusOr<v1::SampleResponse> Receive();
    // Half-closes and returns the stream's final status.
    absl::Status Close();

   private:
    friend class SamplerClient;
    explicit StepStream(SamplerClient* client) : client_(client) {}
    absl::Status Open();
    // Registers again what samplerd lost before a step is sent; when samplerd is going or
    // coming back, this stream's call is ended first (a draining samplerd waits for its open
    // calls to end, so waiting for the next one with the call open would wait out the old
    // one's shutdown deadline) and then resumed.
    absl::Status Prepare();
    // Writes `request` (already in unanswered_, or in_flight_); a broken stream is resumed.
    absl::Status Write(const v1::SampleRequest& request);
    // Ends the current call: half-closes it, reads every answer it still brings (gRPC gives a
    // call's status only once all its messages have been read: Finish without reading them
    // can wait for ever) and keeps those that answer a sent step in ahead_, up to the first
    // that must be resent. `cancel` (after an answer that must be resent: the later ones go
    // with it) cancels the call and keeps none. Returns the call's status.
    absl::Status EndCall(bool cancel);
    // After the stream broke with `status`: waits for samplerd, opens a new stream and resends
    // every step without an answer (those past ahead_). Returns `status` when it is not a
    // broken connection or the client does not wait.
    absl::Status Resume(const absl::Status& status);
    absl::Status Finish();  // the call's status, once per opened stream
    // Whether `response` is an error the client recovers from by resending (a draining
    // samplerd's refusal, or regions a restarted samplerd forgot): this step and every later
    // one of the call go to the next stream.
    bool MustResend(const v1::SampleResponse& response);
    // Steps written and not yet answered to the caller: unanswered_, then in_flight_.
    size_t Sent() const { return unanswered_.size() + (in_flight_ != nullptr ? 1 : 0); }
    SamplerClient* const client_;
    std::unique_ptr<grpc::ClientContext> context_;
    std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> stream_;
    // Steps sent and not yet answered, in order: copies for Send; Step's own request is
    // borrowed (in_flight_, after them) since Step waits for its answer.
    std::deque<v1::SampleRequest> unanswered_;
    const v1::SampleRequest* in_flight_ = nullptr;
    // Answers of the first ahead_.size() sent steps, read from a call that ended (EndCall)
    // before the caller asked for them: Receive returns them first, and they are not resent.
    std::deque<v1::SampleResponse> ahead_;
    bool closed_ = false;
    bool finished_ = false;
  };
  absl::StatusOr<std::unique_ptr<StepStream>> OpenStream();

  // A co-located worker's step channel (proto OpenStepChannelRequest): the same steps and
  // answers as a stream's, through a shared-memory object and a futex instead of gRPC, for a
  // worker on samplerd's host. One step at a time; it does not outlive samplerd (a step during
  // a restart fails UNAVAILABLE). Holds this client's keep-alive like a registration.
  class StepChannel {
   public:
    ~StepChannel();
    StepChannel(const StepChannel&) = delete;
    StepChannel& operator=(const StepChannel&) = delete;
    // As StepStream::Step. INVALID_ARGUMENT when the request exceeds the capacity.
    absl::StatusOr<v1::SampleResponse> Step(const v1::SampleRequest& request);
    // Tells samplerd to stop serving it (also the destructor's).
    void Close();

   private:
    friend class SamplerClient;
    StepChannel(SamplerClient* client, std::unique_ptr<ShmBuffer> shm, int64_t capacity,
                absl::Duration spin)
        : client_(client), shm_(std::move(shm)), capacity_(capacity), spin_(spin) {}
    std::atomic<uint32_t>* Word(int offset) const;
    absl::Status Wait(uint32_t seq);
    SamplerClient* const client_;
    const std::unique_ptr<ShmBuffer> shm_;
    const int64_t capacity_;
    const absl::Duration spin_;
    std::string server_id_;
    uint32_t seq_ = 0;
    bool closed_ = false;
  };
  // `spin`: how long a step's wait polls before it sleeps on the futex. Polling keeps the
  // wake-up (tens of microseconds on a busy host) off the step's latency, for a thread that
  // has nothing else to do meanwhile (a worker waiting for its tokens): 112 -> 68 us a step at
  // 16 rows on the 2-core development machine.
  absl::StatusOr<std::unique_ptr<StepChannel>> OpenChannel(
      int64_t capacity_bytes = 4 << 20, absl::Duration spin = absl::Microseconds(500));

  // Registers `shm` as `name`, then unlinks its name from /dev/shm (ShmBuffer says why).
  // A registration belongs to this client: samplerd keeps it while the client is alive, which
  // the client shows by its calls and by a KeepAlive it sends by itself every lease / 3 from
  // its first registration on (a thread of its own, ended by the destructor). When the client
  // is gone (killed, or idle past the lease) samplerd releases its regions.
  absl::Status RegisterShm(const std::string& name, ShmBuffer& shm);
  // Registers a region (RegisterShm's lease applies: the keep-alive starts here too). The
  // client keeps the request to register it again after a samplerd restart: `request`'s
  // handle must stay valid while it is registered.
  absl::Status RegisterBuffer(const v1::RegisterBufferRequest& request);
  absl::Status UnregisterBuffer(const std::string& name);
  // Renews this client's registration lease now; returns the server's lease.
  absl::StatusOr<v1::KeepAliveResponse> KeepAlive();
  absl::StatusOr<v1::ListBuffersResponse> ListBuffers();
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo();
  // grpc.health.v1 Check of `service` ("" = the server as a whole): true when SERVING.
  absl::StatusOr<bool> IsServing(const std::string& service = "");
  // Drops this client's draft pool entries of `request_ids`; returns the rows dropped.
  absl::StatusOr<int> Release(const std::vector<std::string>& request_ids);
  // The random id sent as `samplerd-client-id` metadata with every call: the server scopes
  // this client's draft pool entries by it, and it owns the client's registrations.
  const std::string& client_id() const { return client_id_; }

  ~SamplerClient();

 private:
  SamplerClient(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options);
  void SetDeadline(grpc::ClientContext& context) const;
  // Starts the keep-alive thread once (after the first successful registration).
  void StartKeepAlive();
  absl::Status Register(const v1::RegisterBufferRequest& request, ShmBuffer* shm);
  // Registers again the regions samplerd no longer holds for this client (all of them after
  // a restart), when the keep-alive or a call found some gone. Cheap when nothing is.
  absl::Status RegisterAgainIfNeeded();
  // RegisterAgainIfNeeded where a call is about to be made: a registration that fails because
  // samplerd is going or coming back (a call on the connection to the old one: "Broken pipe")
  // waits for it and registers again (AwaitServer).
  absl::Status EnsureRegistered();
  // Asks samplerd (a KeepAlive) whether it lost this client's regions, as a restarted one does.
  bool RegistrationsLost();
  // Waits up to reconnect_timeout for samplerd to answer and to take back what it lost (a
  // registration that fails as samplerd goes or comes back is waited out too).
  absl::Status AwaitServer();
  // Whether samplerd holds fewer of this client's regions than it registered (a restart:
  // another server_id; or its lease ran out while this process was stopped).
  bool LostRegistrations(const v1::KeepAliveResponse& response);
  // The response's failure is samplerd gone away (restart, rollout, drain).
  bool ShouldWait(const absl::Status& status) const;

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  const std::string client_id_;
  // What this client registered, to register again (in order; by name).
  struct Registration {
    v1::RegisterBufferRequest request;
    ShmBuffer* shm = nullptr;  // RegisterShm's buffer: relinked before registering again
  };
  absl::Mutex registrations_mu_;
  std::vector<Registration> registrations_ ABSL_GUARDED_BY(registrations_mu_);
  std::string server_id_ ABSL_GUARDED_BY(registrations_mu_);
  std::atomic<bool> register_again_{false};
  absl::Mutex keepalive_mu_;
  bool keepalive_stop_ ABSL_GUARDED_BY(keepalive_mu_) = false;
  std::thread keepalive_ ABSL_GUARDED_BY(keepalive_mu_);
};

// grpc::Status -> absl::Status (client side).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_SAMPLER_CLIENT_H_
