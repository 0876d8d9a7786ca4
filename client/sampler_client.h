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
#ifndef SAMPLERD_CLIENT_SAMPLER_CLIENT_H_
#define SAMPLERD_CLIENT_SAMPLER_CLIENT_H_

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
    std::unique_ptr<grpc::ClientContext> context_;
    std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> stream_;
  };
  absl::StatusOr<std::unique_ptr<StepStream>> OpenStream();

  // Registers `shm` as `name`, then unlinks its name from /dev/shm (ShmBuffer says why).
  // A registration belongs to this client: samplerd keeps it while the client is alive, which
  // the client shows by its calls and by a KeepAlive it sends by itself every lease / 3 from
  // its first registration on (a thread of its own, ended by the destructor). When the client
  // is gone (killed, or idle past the lease) samplerd releases its regions.
  absl::Status RegisterShm(const std::string& name, ShmBuffer& shm);
  // Registers a region (RegisterShm's lease applies: the keep-alive starts here too).
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

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sampler::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  const std::string client_id_;
  absl::Mutex keepalive_mu_;
  bool keepalive_stop_ ABSL_GUARDED_BY(keepalive_mu_) = false;
  std::thread keepalive_ ABSL_GUARDED_BY(keepalive_mu_);
};

// grpc::Status -> absl::Status (client side).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_SAMPLER_CLIENT_H_
