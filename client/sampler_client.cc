#include "client/sampler_client.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

// 128 random bits as hex: a client id no other client can guess.
std::string RandomClientId() {
  std::random_device entropy;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(entropy(), absl::kZeroPad8));
  return id;
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::unique_ptr<SamplerClient>> SamplerClient::Connect(const std::string& target,
                                                                      const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target: required (host:port)");
  grpc::ChannelArguments args;
  const int max = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(max);
  args.SetMaxSendMessageSize(max);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (channel == nullptr) return absl::InvalidArgumentError(absl::StrCat("target: ", target));
  return std::unique_ptr<SamplerClient>(new SamplerClient(std::move(channel), options));
}

SamplerClient::SamplerClient(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : options_(options),
      channel_(std::move(channel)),
      stub_(v1::Sampler::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)),
      client_id_(RandomClientId()) {}

void SamplerClient::SetDeadline(grpc::ClientContext& context) const {
  context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  context.AddMetadata("samplerd-client-id", client_id_);
}

absl::StatusOr<int> SamplerClient::Release(const std::vector<std::string>& request_ids) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ReleaseRequest request;
  for (const std::string& id : request_ids) request.add_request_ids(id);
  v1::ReleaseResponse response;
  const grpc::Status status = stub_->Release(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.released_rows();
}

absl::StatusOr<v1::SampleResponse> SamplerClient::Sample(const v1::SampleRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::SampleResponse response;
  const grpc::Status status = stub_->Sample(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<std::unique_ptr<SamplerClient::StepStream>> SamplerClient::OpenStream() {
  auto stream = std::unique_ptr<StepStream>(new StepStream());
  stream->context_ = std::make_unique<grpc::ClientContext>();
  stream->context_->AddMetadata("samplerd-client-id", client_id_);
  stream->stream_ = stub_->SampleStream(stream->context_.get());
  if (stream->stream_ == nullptr) return absl::UnavailableError("cannot open SampleStream");
  return stream;
}

absl::Status SamplerClient::StepStream::Send(const v1::SampleRequest& request) {
  if (stream_->Write(request)) return absl::OkStatus();
  const absl::Status closed = Close();
  return closed.ok() ? absl::UnavailableError("SampleStream closed by the server") : closed;
}

absl::StatusOr<v1::SampleResponse> SamplerClient::StepStream::Receive() {
  v1::SampleResponse response;
  if (!stream_->Read(&response)) {
    absl::Status status = FromGrpcStatus(stream_->Finish());
    if (status.ok()) status = absl::UnavailableError("SampleStream ended by the server");
    return status;
  }
  return response;
}

absl::StatusOr<v1::SampleResponse> SamplerClient::StepStream::Step(
    const v1::SampleRequest& request) {
  if (absl::Status sent = Send(request); !sent.ok()) return sent;
  return Receive();
}

absl::Status SamplerClient::StepStream::Close() {
  stream_->WritesDone();
  v1::SampleResponse ignored;
  while (stream_->Read(&ignored)) {
  }
  return FromGrpcStatus(stream_->Finish());
}

absl::Status SamplerClient::RegisterShm(const std::string& name, ShmBuffer& shm) {
  v1::RegisterBufferRequest request;
  request.set_name(name);
  request.set_kind(v1::HOST_SHM);
  request.set_shm_name(shm.shm_name());
  request.set_byte_size(shm.byte_size());
  absl::Status status = RegisterBuffer(request);
  // samplerd has opened and mapped it: the name is no longer needed, and a crash now leaves
  // nothing in /dev/shm.
  if (status.ok()) shm.Unlink();
  return status;
}

absl::Status SamplerClient::RegisterBuffer(const v1::RegisterBufferRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::RegisterBufferResponse response;
  absl::Status status = FromGrpcStatus(stub_->RegisterBuffer(&context, request, &response));
  if (status.ok()) StartKeepAlive();
  return status;
}

absl::StatusOr<v1::KeepAliveResponse> SamplerClient::KeepAlive() {
  grpc::ClientContext context;
  SetDeadline(context);
  // Short: the destructor waits for a keep-alive in flight.
  context.set_deadline(std::min(context.deadline(),
                                std::chrono::system_clock::now() + std::chrono::seconds(2)));
  v1::KeepAliveResponse response;
  const grpc::Status status = stub_->KeepAlive(&context, v1::KeepAliveRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

void SamplerClient::StartKeepAlive() {
  absl::MutexLock lock(&keepalive_mu_);
  if (keepalive_.joinable() || keepalive_stop_) return;
  keepalive_ = std::thread([this] {
    absl::Duration period = absl::Seconds(1);
    absl::MutexLock lock(&keepalive_mu_);
    while (!keepalive_stop_) {
      keepalive_mu_.Unlock();
      auto renewed = KeepAlive();
      if (renewed.ok()) {
        // A third of the lease: two pings may be lost before it runs out. No lease: rarely.
        period = renewed->lease_ms() > 0
                     ? std::max(absl::Milliseconds(50), absl::Milliseconds(renewed->lease_ms()) / 3)
                     : absl::Seconds(10);
      }
      keepalive_mu_.Lock();
      keepalive_mu_.AwaitWithTimeout(absl::Condition(&keepalive_stop_), period);
    }
  });
}

SamplerClient::~SamplerClient() {
  std::thread keepalive;
  {
    absl::MutexLock lock(&keepalive_mu_);
    keepalive_stop_ = true;
    keepalive = std::move(keepalive_);
  }
  if (keepalive.joinable()) keepalive.join();
}

absl::Status SamplerClient::UnregisterBuffer(const std::string& name) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::UnregisterBufferRequest request;
  request.set_name(name);
  v1::UnregisterBufferResponse response;
  return FromGrpcStatus(stub_->UnregisterBuffer(&context, request, &response));
}

absl::StatusOr<v1::ListBuffersResponse> SamplerClient::ListBuffers() {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ListBuffersResponse response;
  const grpc::Status status = stub_->ListBuffers(&context, v1::ListBuffersRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::GetServerInfoResponse> SamplerClient::GetServerInfo() {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetServerInfoResponse response;
  const grpc::Status status = stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<bool> SamplerClient::IsServing(const std::string& service) {
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = health_->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace samplerd
