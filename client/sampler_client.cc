#include "client/sampler_client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "samplerd/v1/step_channel_layout.h"

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

namespace {

// A PEM file's contents ("" for no file), or INVALID_ARGUMENT naming the option.
absl::StatusOr<std::string> ReadClientFile(const std::string& path, const char* option) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(option, ": cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SamplerClient>> SamplerClient::Connect(const std::string& target,
                                                                      const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target: required (host:port)");
  grpc::ChannelArguments args;
  const int max = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(max);
  args.SetMaxSendMessageSize(max);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // samplerd is a sidecar on this host: after a restart, try again within 100 ms to 1 s
  // rather than gRPC's default backoff (up to 2 minutes). Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS:
  // gRPC takes it as the least time a connection attempt is given (default 20 s), and at
  // 100 ms a loaded host's connections failed before the server's SETTINGS frame came
  // ("connection attempt timed out before receiving SETTINGS frame", 160 clients at once).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
      !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "tls_cert_file, tls_key_file: a client certificate needs its key (give both)");
    }
    // An empty CA file name: gRPC's default roots (a public CA's certificate).
    auto ca = ReadClientFile(options.tls_ca_file, "tls_ca_file");
    auto cert = ReadClientFile(options.tls_cert_file, "tls_cert_file");
    auto key = ReadClientFile(options.tls_key_file, "tls_key_file");
    for (const auto* file : {&ca, &cert, &key}) {
      if (!file->ok()) return file->status();
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *std::move(ca);
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
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
  if (absl::Status again = EnsureRegistered(); !again.ok()) return again;
  // Up to two retries, as a stream resumes up to twice an answer: a call can fail once more
  // after the keep-alive has reached the new samplerd (the restart test saw "Broken pipe" on
  // the retry, under ASan), and a step that takes samplerd down every time is not retried for
  // ever.
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::SampleResponse response;
    const absl::Status status = FromGrpcStatus(stub_->Sample(&context, request, &response));
    if (status.ok()) return response;
    if (attempt == 2 || !ShouldWait(status)) return status;
    if (status.code() == absl::StatusCode::kNotFound) {
      // A samplerd restarted under us that this client had not yet noticed forgot its
      // regions: register them again and retry; any other NOT_FOUND is the answer.
      if (!RegistrationsLost()) return status;
      if (absl::Status again = EnsureRegistered(); !again.ok()) return again;
    } else if (absl::Status back = AwaitServer(); !back.ok()) {
      return back;
    }
  }
}

bool SamplerClient::RegistrationsLost() {
  absl::StatusOr<v1::KeepAliveResponse> alive = KeepAlive();  // flags register_again_
  return alive.ok() && register_again_.load(std::memory_order_acquire);
}

bool SamplerClient::ShouldWait(const absl::Status& status) const {
  // UNAVAILABLE is samplerd gone (connection refused or reset, or draining for a restart);
  // CANCELLED, which this client never asks for on a call it waits on, is a samplerd shutting
  // down (gRPC's server cancels the calls it had not started: grpc/grpc#41785); NOT_FOUND may
  // be a restarted samplerd that no longer knows this client's regions (the caller asks before
  // it resends). Every other code is an answer.
  return options_.reconnect_timeout.count() > 0 &&
         (status.code() == absl::StatusCode::kUnavailable ||
          status.code() == absl::StatusCode::kCancelled ||
          status.code() == absl::StatusCode::kNotFound);
}

absl::Status SamplerClient::AwaitServer() {
  const auto deadline = std::chrono::system_clock::now() + options_.reconnect_timeout;
  v1::KeepAliveResponse response;
  for (;;) {
    grpc::ClientContext context;
    context.AddMetadata("samplerd-client-id", client_id_);
    context.set_wait_for_ready(true);  // through connection failures
    context.set_deadline(deadline);
    grpc::Status status = stub_->KeepAlive(&context, v1::KeepAliveRequest(), &response);
    if (status.ok()) {
      if (LostRegistrations(response)) register_again_.store(true);
      // Registering again can still meet the old connection ("Broken pipe") or a samplerd
      // going down again: that is waited out like the keep-alive's own failures.
      const absl::Status again = RegisterAgainIfNeeded();
      if (again.ok() || !ShouldWait(again)) return again;
      status = grpc::Status(static_cast<grpc::StatusCode>(again.code()),
                            std::string(again.message()));
    }
    // A samplerd still draining answers UNAVAILABLE itself, and gRPC's server cancels the calls
    // it had not started when it shuts down (grpc/grpc#41785): wait for the next one.
    if ((status.error_code() != grpc::StatusCode::UNAVAILABLE &&
         status.error_code() != grpc::StatusCode::CANCELLED) ||
        std::chrono::system_clock::now() + std::chrono::milliseconds(50) >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "samplerd did not come back within ", options_.reconnect_timeout.count(),
          " ms (reconnect_timeout): ", status.error_message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool SamplerClient::LostRegistrations(const v1::KeepAliveResponse& response) {
  absl::MutexLock lock(&registrations_mu_);
  if (registrations_.empty()) return false;
  return response.server_id() != server_id_ ||
         response.buffers() < static_cast<int>(registrations_.size());
}

absl::Status SamplerClient::EnsureRegistered() {
  const absl::Status status = RegisterAgainIfNeeded();
  // AwaitServer waits for samplerd and registers again, within reconnect_timeout.
  return status.ok() || !ShouldWait(status) ? status : AwaitServer();
}

absl::Status SamplerClient::RegisterAgainIfNeeded() {
  if (!register_again_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&registrations_mu_);
  if (!register_again_.load()) return absl::OkStatus();  // another thread did it
  // The names samplerd still holds for this client (none after a restart).
  absl::flat_hash_set<std::string> held;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::ListBuffersResponse listed;
    const grpc::Status status = stub_->ListBuffers(&context, v1::ListBuffersRequest(), &listed);
    if (!status.ok()) return FromGrpcStatus(status);
    const std::string owner = "id:" + client_id_;  // as samplerd names a client's scope
    for (const v1::BufferInfo& info : listed.buffers()) {
      if (info.owner() == owner) held.insert(info.name());
    }
  }
  for (Registration& registration : registrations_) {
    if (held.contains(registration.request.name())) continue;
    if (registration.shm != nullptr) {
      // Its old name was unlinked once registered: the memory moves to a new object.
      if (absl::Status moved = registration.shm->Relink(); !moved.ok()) return moved;
      registration.request.set_shm_name(registration.shm->shm_name());
    }
    grpc::ClientContext context;
    SetDeadline(context);
    v1::RegisterBufferResponse response;
    const absl::Status status =
        FromGrpcStatus(stub_->RegisterBuffer(&context, registration.request, &response));
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("registering '", registration.request.name(),
                                       "' again with samplerd: ", status.message()));
    }
    if (registration.shm != nullptr) registration.shm->Unlink();
    server_id_ = response.server_id();
  }
  register_again_.store(false, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SamplerClient::StepStream>> SamplerClient::OpenStream() {
  if (absl::Status again = EnsureRegistered(); !again.ok()) return again;
  auto stream = std::unique_ptr<StepStream>(new StepStream(this));
  if (absl::Status opened = stream->Open(); !opened.ok()) return opened;
  return stream;
}

absl::Status SamplerClient::StepStream::Open() {
  context_ = std::make_unique<grpc::ClientContext>();
  context_->AddMetadata("samplerd-client-id", client_->client_id_);
  stream_ = client_->stub_->SampleStream(context_.get());
  if (stream_ == nullptr) return absl::UnavailableError("cannot open SampleStream");
  finished_ = false;
  return absl::OkStatus();
}

absl::Status SamplerClient::StepStream::Finish() {
  finished_ = true;
  return FromGrpcStatus(stream_->Finish());
}

bool SamplerClient::StepStream::MustResend(const v1::SampleResponse& response) {
  if (!response.has_error()) return false;
  const auto code = static_cast<absl::StatusCode>(response.error().code());
  if (!client_->ShouldWait(absl::Status(code, ""))) return false;
  if (code == absl::StatusCode::kUnavailable) {
    // A draining samplerd (a rollout) refuses the steps it reads after the drain began, each
    // with UNAVAILABLE, then ends the stream: they go to the next samplerd. Other per-step
    // UNAVAILABLE answers (a failed context-parallel group) are answers.
    return absl::StrContains(response.error().message(), "samplerd is shutting down");
  }
  // NOT_FOUND from a samplerd that restarted without this client noticing: the steps after
  // this one read the same lost regions, so every unanswered step is resent, in order, once
  // the regions are registered again.
  return code == absl::StatusCode::kNotFound && client_->RegistrationsLost();
}

absl::Status SamplerClient::StepStream::EndCall(bool cancel) {
  if (finished_) return absl::UnavailableError("SampleStream ended");
  if (cancel) {
    context_->TryCancel();
  } else {
    stream_->WritesDone();  // a samplerd waiting for the next step ends the call
  }
  v1::SampleResponse response;
  bool resend = cancel;  // from the first answer that must be resent on: dropped
  while (stream_->Read(&response)) {
    if (resend || ahead_.size() >= Sent()) continue;
    resend = MustResend(response);
    if (!resend) ahead_.push_back(std::move(response));
  }
  return Finish();
}

absl::Status SamplerClient::StepStream::Resume(const absl::Status& status) {
  if (!client_->ShouldWait(status)) return status;
  if (absl::Status back = client_->AwaitServer(); !back.ok()) return back;
  if (absl::Status opened = Open(); !opened.ok()) return opened;
  // A write that fails here finds the new call broken too: the next Read sees it and resumes
  // again (Receive bounds how often).
  size_t i = 0;
  for (const v1::SampleRequest& request : unanswered_) {
    if (i++ >= ahead_.size() && !stream_->Write(request)) return absl::OkStatus();
  }
  if (in_flight_ != nullptr && i >= ahead_.size()) stream_->Write(*in_flight_);
  return absl::OkStatus();
}

absl::Status SamplerClient::StepStream::Write(const v1::SampleRequest& request) {
  // A stream already finished (an earlier resume failed) is not written or finished again:
  // gRPC's Finish on a finished call does not return.
  if (!finished_ && stream_->Write(request)) return absl::OkStatus();
  absl::Status status = EndCall(/*cancel=*/false);
  if (status.ok()) status = absl::UnavailableError("SampleStream closed by the server");
  return Resume(status);  // resends `request` with every other unanswered step
}

absl::Status SamplerClient::StepStream::Prepare() {
  if (closed_) return absl::FailedPreconditionError("the stream is closed");
  const absl::Status again = client_->RegisterAgainIfNeeded();
  if (again.ok() || !client_->ShouldWait(again)) return again;
  (void)EndCall(/*cancel=*/false);  // its answers are kept; the rest are resent
  return Resume(again);
}

absl::Status SamplerClient::StepStream::Send(const v1::SampleRequest& request) {
  if (absl::Status ready = Prepare(); !ready.ok()) return ready;
  unanswered_.push_back(request);
  return Write(unanswered_.back());
}

absl::StatusOr<v1::SampleResponse> SamplerClient::StepStream::Receive() {
  v1::SampleResponse response;
  // A stream may be resumed twice per answer (samplerd restarted twice in a row); a step
  // that takes samplerd down every time is not resent for ever.
  for (int resumed = 0;; ++resumed) {
    if (!ahead_.empty()) {
      response = std::move(ahead_.front());
      ahead_.pop_front();
      break;
    }
    absl::Status status;
    if (!finished_ && stream_->Read(&response)) {
      if (!MustResend(response)) break;
      // This step and the later ones go to the next samplerd (or the same one, its regions
      // registered again): the call's other answers are dropped with it.
      status = absl::UnavailableError(
          absl::StrCat("SampleStream step refused: ", response.error().message()));
      (void)EndCall(/*cancel=*/true);
    } else {
      status = EndCall(/*cancel=*/false);  // Read failed: no answer is left to keep
      if (status.ok()) status = absl::UnavailableError("SampleStream ended by the server");
    }
    if (resumed == 2) return status;
    if (absl::Status back = Resume(status); !back.ok()) return back;
  }
  if (!unanswered_.empty()) {
    unanswered_.pop_front();
  } else {
    in_flight_ = nullptr;
  }
  return response;
}

absl::StatusOr<v1::SampleResponse> SamplerClient::StepStream::Step(
    const v1::SampleRequest& request) {
  if (!unanswered_.empty()) {  // pipelined before: answers come in order
    if (absl::Status sent = Send(request); !sent.ok()) return sent;
    return Receive();
  }
  if (absl::Status ready = Prepare(); !ready.ok()) return ready;
  // Borrowed, not copied: Step waits for the answer.
  in_flight_ = &request;
  absl::Status sent = Write(request);
  absl::StatusOr<v1::SampleResponse> response =
      sent.ok() ? Receive() : absl::StatusOr<v1::SampleResponse>(sent);
  in_flight_ = nullptr;
  ahead_.clear();  // none: Receive took the answer or the stream failed
  return response;
}

absl::Status SamplerClient::StepStream::Close() {
  closed_ = true;
  if (finished_) return absl::OkStatus();
  absl::Status status = EndCall(/*cancel=*/false);
  // A stream that samplerd's restart broke while it was idle lost nothing.
  if (absl::IsUnavailable(status) && Sent() == 0) return absl::OkStatus();
  return status;
}

absl::Status SamplerClient::RegisterShm(const std::string& name, ShmBuffer& shm) {
  v1::RegisterBufferRequest request;
  request.set_name(name);
  request.set_kind(v1::HOST_SHM);
  request.set_shm_name(shm.shm_name());
  request.set_byte_size(shm.byte_size());
  absl::Status status = Register(request, &shm);
  // samplerd has opened and mapped it: the name is no longer needed, and a crash now leaves
  // nothing in /dev/shm.
  if (status.ok()) shm.Unlink();
  return status;
}

absl::Status SamplerClient::RegisterBuffer(const v1::RegisterBufferRequest& request) {
  return Register(request, nullptr);
}

absl::Status SamplerClient::Register(const v1::RegisterBufferRequest& request, ShmBuffer* shm) {
  if (absl::Status again = EnsureRegistered(); !again.ok()) return again;
  grpc::ClientContext context;
  SetDeadline(context);
  v1::RegisterBufferResponse response;
  absl::Status status = FromGrpcStatus(stub_->RegisterBuffer(&context, request, &response));
  if (!status.ok()) return status;
  {
    absl::MutexLock lock(&registrations_mu_);
    // samplerd restarted since the earlier registrations: they are gone.
    if (!registrations_.empty() && server_id_ != response.server_id()) register_again_ = true;
    server_id_ = response.server_id();
    auto same = std::find_if(registrations_.begin(), registrations_.end(),
                             [&](const Registration& r) { return r.request.name() == request.name(); });
    if (same == registrations_.end()) same = registrations_.emplace(registrations_.end());
    same->request = request;
    same->shm = shm;
  }
  StartKeepAlive();
  return absl::OkStatus();
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
  // The next call registers again (on the caller's thread: relinking an shm region copies it,
  // which must not race the worker's writes).
  if (LostRegistrations(response)) register_again_.store(true, std::memory_order_release);
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
  const absl::Status status =
      FromGrpcStatus(stub_->UnregisterBuffer(&context, request, &response));
  if (status.ok() || status.code() == absl::StatusCode::kNotFound) {
    absl::MutexLock lock(&registrations_mu_);
    registrations_.erase(std::remove_if(registrations_.begin(), registrations_.end(),
                                        [&](const Registration& r) { return r.request.name() == name; }),
                         registrations_.end());
  }
  return status;
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

// The channel's header: samplerd/v1/step_channel_layout.h.
namespace {
using channel_layout::FutexWait;
using channel_layout::FutexWake;
using channel_layout::kCapacityAt;
using channel_layout::kClosedByWorker;
using channel_layout::kHeaderBytes;
using channel_layout::kMagicAt;
using channel_layout::kOpen;
using channel_layout::kRequestLenAt;
using channel_layout::kRequestSeqAt;
using channel_layout::kResponseLenAt;
using channel_layout::kResponseSeqAt;
using channel_layout::kStateAt;
using channel_layout::kVersionAt;
}  // namespace

absl::StatusOr<std::unique_ptr<SamplerClient::StepChannel>> SamplerClient::OpenChannel(
    int64_t capacity_bytes, absl::Duration spin) {
  if (capacity_bytes < 1 || capacity_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("capacity_bytes: outside [1, 2^30]");
  }
  std::mt19937_64 rng(std::random_device{}());
  auto shm = ShmBuffer::Create(absl::StrCat("/samplerd-chan-", getpid(), "-", rng() % 1000000007),
                               kHeaderBytes + 2 * capacity_bytes);
  if (!shm.ok()) return shm.status();
  std::unique_ptr<StepChannel> channel(
      new StepChannel(this, *std::move(shm), capacity_bytes, spin));
  channel->Word(kMagicAt)->store(channel_layout::kMagic);
  channel->Word(kVersionAt)->store(channel_layout::kVersion);
  channel->Word(kCapacityAt)->store(static_cast<uint32_t>(capacity_bytes));
  v1::OpenStepChannelRequest request;
  request.set_shm_name(channel->shm_->shm_name());
  request.set_capacity_bytes(capacity_bytes);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::OpenStepChannelResponse response;
  const grpc::Status status = stub_->OpenStepChannel(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  channel->server_id_ = response.server_id();
  channel->shm_->Unlink();  // both sides have it mapped: no name left behind by a crash
  StartKeepAlive();
  return channel;
}

SamplerClient::StepChannel::~StepChannel() { Close(); }

std::atomic<uint32_t>* SamplerClient::StepChannel::Word(int offset) const {
  return channel_layout::Word(shm_->data(), offset);
}

void SamplerClient::StepChannel::Close() {
  if (closed_) return;
  closed_ = true;
  Word(kStateAt)->store(kClosedByWorker, std::memory_order_release);
  FutexWake(Word(kRequestSeqAt));
}

absl::Status SamplerClient::StepChannel::Wait(uint32_t seq) {
  std::atomic<uint32_t>* response_seq = Word(kResponseSeqAt);
  // Polling first (OpenChannel's `spin`), then the futex.
  const auto spin_end = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin_);
  while (response_seq->load(std::memory_order_acquire) != seq &&
         std::chrono::steady_clock::now() < spin_end) {
  }
  auto check_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  const timespec poll = {0, 100 * 1000 * 1000};
  while (true) {
    const uint32_t current = response_seq->load(std::memory_order_acquire);
    if (current == seq) return absl::OkStatus();
    if (Word(kStateAt)->load(std::memory_order_acquire) != kOpen) {
      return absl::UnavailableError("samplerd closed the step channel");
    }
    if (std::chrono::steady_clock::now() > check_at) {
      // Still there, and the same samplerd? (A killed one never answers.)
      absl::StatusOr<v1::KeepAliveResponse> alive = client_->KeepAlive();
      if (!alive.ok()) {
        return absl::UnavailableError(
            absl::StrCat("samplerd went away during a channel step: ", alive.status().message()));
      }
      if (alive->server_id() != server_id_) {
        return absl::UnavailableError("samplerd restarted during a channel step (open a new channel)");
      }
      check_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
    FutexWait(response_seq, current, poll);
  }
}

absl::StatusOr<v1::SampleResponse> SamplerClient::StepChannel::Step(
    const v1::SampleRequest& request) {
  if (closed_) return absl::CancelledError("the channel is closed");
  const size_t bytes = request.ByteSizeLong();
  if (static_cast<int64_t>(bytes) > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the step's ", bytes, " bytes exceed the channel's capacity of ", capacity_,
        " (open it with a larger capacity_bytes)"));
  }
  char* base = static_cast<char*>(shm_->data());
  request.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(base + kHeaderBytes));
  Word(kRequestLenAt)->store(static_cast<uint32_t>(bytes), std::memory_order_relaxed);
  const uint32_t seq = ++seq_;
  Word(kRequestSeqAt)->store(seq, std::memory_order_release);
  FutexWake(Word(kRequestSeqAt));
  if (absl::Status answered = Wait(seq); !answered.ok()) return answered;
  const uint32_t length = Word(kResponseLenAt)->load(std::memory_order_relaxed);
  v1::SampleResponse response;
  if (length > capacity_ ||
      !response.ParseFromArray(base + kHeaderBytes + capacity_, static_cast<int>(length))) {
    return absl::InternalError("the channel's response is not a SampleResponse");
  }
  return response;
}

}  // namespace samplerd
