// samplerd: the sampling server. See README.md; `samplerd --help` lists the flags.
//
//   samplerd                                   # CPU backend on 127.0.0.1:50051
//   samplerd --listen=0.0.0.0:50051 --tls_cert_file=tls.crt --tls_key_file=tls.key
//            --tls_client_ca_file=ca.crt --metrics_address=0.0.0.0:9464   (mutual TLS)
//
// SIGTERM or SIGINT drains: health turns NOT_SERVING, new steps are refused, accepted steps
// are answered, and the process exits 0 within --shutdown_deadline_ms.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpc/health/v1/health.pb.h"
#include "sampler/cpu_backend.h"
#ifdef SAMPLERD_WITH_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ipc.h"
#include "cuda/nccl_transport.h"
#endif
#include "server/buffer_registry.h"
#include "server/connection_ledger.h"
#include "server/group_registry.h"
#include "server/local_listener.h"
#include "server/metrics.h"
#include "server/peer_identity.h"
#include "server/periodic_task.h"
#include "server/sampler_service.h"
#include "server/tls_listener.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address host:port (port 0 picks a free port); empty = TCP off");
ABSL_FLAG(std::string, unix_socket, "", "also listen on this Unix-domain socket path");
ABSL_FLAG(std::string, unix_socket_mode, "0600",
          "file mode of the unix socket (octal; 0600: only samplerd's uid may connect, as a "
          "pod's containers sharing uid 10001 do; 0660 adds its group)");
ABSL_FLAG(std::string, tls_cert_file, "",
          "TLS on the TCP listener: the server certificate chain (PEM); re-read every "
          "--tls_reload_interval_s, so a rotated Secret takes effect without a restart");
ABSL_FLAG(std::string, tls_key_file, "", "TLS: the server certificate's private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "mutual TLS: CA bundle (PEM) that every client certificate must chain to; clients "
          "without a valid certificate are refused at the handshake");
ABSL_FLAG(std::vector<std::string>, tls_allowed_clients, {},
          "mutual TLS: client certificate identities (subject alternative names: DNS, URI, "
          "e-mail or IP, comma-separated) that may call the rpcs changing server state "
          "(RegisterBuffer, UnregisterBuffer, ListBuffers, CreateGroup, DestroyGroup, "
          "OpenStepChannel) and name registered buffers, groups or CUDA events in steps; other "
          "clients may only sample with inline logits. Empty: every client may");
ABSL_FLAG(int, tls_reload_interval_s, 60, "how often the TLS files are re-read (seconds)");
ABSL_FLAG(int, tls_handshake_timeout_ms, 10000,
          "a TLS connection whose handshake is not done within this long is closed (gRPC's "
          "default is 120 s: a peer without a certificate could hold a descriptor that long)");
ABSL_FLAG(std::string, tls_state_dir, "",
          "a writable directory for the checked copies of the TLS files that gRPC reads "
          "(default $TMPDIR or /tmp; a read-only root filesystem needs a volume here)");
ABSL_FLAG(bool, allow_insecure_network, false,
          "serve plaintext on a non-loopback --listen address (refused otherwise; say it only "
          "where something else, such as a service mesh, encrypts the traffic)");
ABSL_FLAG(std::string, backend, "auto", "auto | cpu | cuda (auto: CUDA when a GPU is usable)");
ABSL_FLAG(int, threads, 0, "CPU backend worker threads (0 = all cores)");
ABSL_FLAG(int, cuda_device, 0, "CUDA device of the CUDA backend");
ABSL_FLAG(int, malloc_arenas, 16,
          "glibc malloc arenas (M_ARENA_MAX): fewer bound the memory that freed large messages "
          "keep cached; more let concurrent steps allocate without contending");
ABSL_FLAG(int, cuda_streams, 4,
          "CUDA backend: steps on the device at once, each on its own CUDA stream with its own "
          "buffers (one step's host work and copies overlap another's kernels)");
ABSL_FLAG(bool, cuda_experimental_kernels, false,
          "No effect, kept so that existing command lines still start: it gated raw logprobs "
          "(logprobs_mode RAW), which the CUDA backend now serves by default");
ABSL_FLAG(bool, cuda_device_step_output, true,
          "CUDA backend: a step's StepOutput (tokens into the worker's memory) is written by the "
          "device right after the kernels; false: from the host once the results are back");
ABSL_FLAG(int64_t, max_message_bytes, 256LL << 20,
          "largest gRPC message accepted; 256 MiB fits inline fp32 logits of 384 x 129,280");
ABSL_FLAG(int, max_rows, 1 << 20, "most logits rows in one step");
ABSL_FLAG(int, max_vocab_size, 1 << 22, "largest vocab_size / logits cols");
ABSL_FLAG(int, max_top_logprobs, 64, "largest top_logprobs a request may ask for (>= 20)");
ABSL_FLAG(int, max_force_top_n, 16384, "largest force_top_n");
ABSL_FLAG(int, max_token_list, 16384,
          "longest token list of a request's adjustments (allowed_token_ids, stop_token_ids, "
          "logit_bias entries, bad_words tokens in all)");
ABSL_FLAG(int, max_queued_steps, 64,
          "steps admitted at once; further steps get RESOURCE_EXHAUSTED at once");
ABSL_FLAG(int64_t, draft_pool_bytes, 325LL * (129280 * 4 + 256),
          "draft pool capacity in bytes, bookkeeping included (a dense row costs 4 V bytes plus "
          "128, a top-N row 8 N plus 128); with the CUDA backend, its device memory");
ABSL_FLAG(int64_t, draft_pool_ttl_ms, 60000,
          "a draft pool entry whose DECODE step has not come this long after its DRAFT step is "
          "dropped");
ABSL_FLAG(int64_t, registration_lease_ms, 5000,
          "a client's registered buffers are released this long after its last call (steps, "
          "KeepAlive, which the C++ and Python clients send by themselves), and at once when a "
          "stream of it drops; 0: only when unregistered or a stream drops");
ABSL_FLAG(int64_t, max_request_memory_bytes, 2LL << 30,
          "memory that steps in flight may make the server allocate (shard concatenation), "
          "reserved before allocating; a step that does not fit fails with RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_inflight_message_bytes, 1LL << 30,
          "gRPC resource quota: memory for messages being received and sent, over all calls; "
          "beyond it gRPC stops reading from connections until memory is freed");
ABSL_FLAG(int, max_rpc_threads, 256,
          "gRPC resource quota: most threads serving calls at once (each open SampleStream holds "
          "one); a call beyond it fails with RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, shm_allowed_uids, "",
          "comma-separated uids whose POSIX shm objects may be registered as HOST_SHM regions "
          "(empty = the server's own uid only)");
ABSL_FLAG(bool, allow_insecure_metrics, false,
          "serve --metrics_address off loopback although it is plaintext HTTP");
ABSL_FLAG(std::string, metrics_address, "",
          "serve Prometheus /metrics on host:port (empty = off)");
ABSL_FLAG(int, context_check_interval_ms, 500,
          "CUDA: how often the device context is checked while idle; a context torn down (under "
          "MPS, by another client's fatal fault) makes samplerd drain and exit 3. 0: off");
ABSL_FLAG(bool, probe_gpu_context, false,
          "make a CUDA context on --cuda_device and exit: 0 when a new process gets one (under "
          "MPS: the server takes new clients), 1 with the error otherwise");
ABSL_FLAG(int64_t, max_context_token_rows, int64_t{1} << 28,
          "a request's context tokens (prompt, output, drafts) times its sampled rows, where it "
          "has penalties or DRY: the history work one request may ask for");
ABSL_FLAG(int, max_open_streams, 0,
          "SampleStreams open at once over all clients (each holds a thread); 0: "
          "--max_rpc_threads less 16, so unary calls, GetServerInfo and health always find one");
ABSL_FLAG(int, max_streams_per_client, 64, "SampleStreams one client may hold open");
ABSL_FLAG(int, max_step_channels, 64, "step channels open at once over all clients");
ABSL_FLAG(int, max_channels_per_client, 8, "step channels one client may hold open");
ABSL_FLAG(int, max_connections, 1024,
          "connections held at once over all clients, on the plaintext TCP listener and the "
          "unix socket (each holds a descriptor and ~13 KB even idle); one more is closed at accept");
ABSL_FLAG(int, max_connections_per_uid, 512,
          "connections one local user (the uid the kernel reports for the socket; clients "
          "whose uid is unknown count as one user) may hold at once");
ABSL_FLAG(int, shutdown_grace_ms, 0,
          "on SIGTERM, report NOT_SERVING this long before refusing new steps");
ABSL_FLAG(int, shutdown_deadline_ms, 10000, "then answer accepted steps for at most this long");
ABSL_FLAG(int, drain_idle_stream_ms, 1000,
          "while draining, end a SampleStream that has sent no step for this long (a worker "
          "between steps is refused at its next one; an idle one would hold the drain)");
ABSL_FLAG(std::string, port_file, "",
          "once serving, write the bound gRPC port and the metrics port (0 = off), one a line");
ABSL_FLAG(std::string, log_level, "info", "trace | debug | info | warn | error");
ABSL_FLAG(int, max_groups, 16,
          "most context-parallel groups at once (CUDA backend; CreateGroup beyond it: "
          "RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, max_group_logits_bytes, int64_t{1} << 30,
          "largest NCCL logits receive buffer a group may ask for (CreateGroup's "
          "max_logits_bytes; device memory, allocated at CreateGroup)");

namespace samplerd {
namespace {

constexpr char kServiceName[] = "samplerd.v1.Sampler";

#ifdef SAMPLERD_WITH_CUDA
// The buffer registry's CUDA IPC opener, over cuda/cuda_ipc.
class CudaMemoryOpener final : public DeviceMemoryOpener {
 public:
  explicit CudaMemoryOpener(int device) : device_(device) {}
  absl::StatusOr<std::shared_ptr<const void>> OpenMemory(const CudaIpcHandle& handle,
                                                         int64_t byte_size, int device,
                                                         const void** data,
                                                         int64_t* bytes) override {
    auto memory = CudaIpcMemory::Open(handle.data(), byte_size, device);
    if (!memory.ok()) return memory.status();
    *data = (*memory)->data();
    *bytes = (*memory)->byte_size();
    return std::shared_ptr<const void>(std::move(*memory));
  }
  absl::StatusOr<std::shared_ptr<const void>> OpenEvent(const CudaIpcHandle& handle, int device,
                                                        const void** event) override {
    auto opened = CudaIpcEvent::Open(handle.data(), device);
    if (!opened.ok()) return opened.status();
    *event = (*opened)->native();
    return std::shared_ptr<const void>(std::move(*opened));
  }
  absl::StatusOr<std::shared_ptr<const void>> PinHostMemory(const void* data,
                                                            int64_t bytes) override {
    auto pinned = PinnedHostMemory::Pin(data, bytes, device_, /*read_only=*/true);
    if (!pinned.ok()) return pinned.status();
    return std::shared_ptr<const void>(std::move(*pinned));
  }
  int device() const override { return device_; }
  bool CanAccessPeer(int peer) const override { return CudaCanAccessPeer(device_, peer); }

 private:
  const int device_;
};
#endif

// Set when samplerd drains because its backend broke (Backend::Broken): the exit code says so
// (kExitBackendBroken), so the pod's restart policy gives it a new CUDA context.
std::atomic<bool> g_backend_broken{false};
constexpr int kExitBackendBroken = 3;

int Serve() {
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  if (absl::GetFlag(FLAGS_probe_gpu_context)) {
    // A new process's context, as a restarted worker's would be: the MPS daemon's liveness.
#ifdef SAMPLERD_WITH_CUDA
    auto probed = ProbeDeviceContext(absl::GetFlag(FLAGS_cuda_device));
#else
    absl::StatusOr<std::string> probed =
        absl::UnavailableError("this samplerd was built without CUDA");
#endif
    if (!probed.ok()) {
      std::fprintf(stderr, "probe_gpu_context: %s\n",
                   std::string(probed.status().message()).c_str());
      return 1;
    }
    std::printf("probe_gpu_context: %s\n", probed->c_str());
    return 0;
  }
  const std::string backend_flag = absl::GetFlag(FLAGS_backend);
  if (backend_flag != "auto" && backend_flag != "cpu" && backend_flag != "cuda") {
    spdlog::error("--backend={}: expected auto, cpu or cuda", backend_flag);
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_top_logprobs) < 20) {
    spdlog::error("--max_top_logprobs must be at least 20");
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_token_list) < 0) {
    spdlog::error("--max_token_list must be >= 0");
    return 2;
  }
  if (absl::GetFlag(FLAGS_cuda_streams) < 1 || absl::GetFlag(FLAGS_cuda_streams) > 64) {
    spdlog::error("--cuda_streams must be in [1, 64]");
    return 2;
  }
  DraftPoolOptions pool_options;
  pool_options.capacity_bytes = absl::GetFlag(FLAGS_draft_pool_bytes);
  pool_options.ttl = absl::Milliseconds(absl::GetFlag(FLAGS_draft_pool_ttl_ms));
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceMemoryOpener> device_memory;  // with the CUDA backend only
#ifdef SAMPLERD_WITH_CUDA
  if (backend_flag != "cpu") {
    std::string why;
    const int device = absl::GetFlag(FLAGS_cuda_device);
    if (CudaDeviceUsable(device, &why)) {
      CudaBackendOptions cuda_options;
      cuda_options.device = device;
      cuda_options.draft_pool = pool_options;
      cuda_options.streams = absl::GetFlag(FLAGS_cuda_streams);
      cuda_options.device_step_output = absl::GetFlag(FLAGS_cuda_device_step_output);
      auto cuda = CudaBackend::Create(cuda_options);
      if (cuda.ok()) {
        backend = std::move(*cuda);
        device_memory = std::make_unique<CudaMemoryOpener>(device);
      } else {
        why = cuda.status().ToString();
      }
    }
    if (backend == nullptr) {
      if (backend_flag == "cuda") {
        spdlog::error("--backend=cuda: {}", why);
        return 2;
      }
      spdlog::info("no usable GPU ({}): using the CPU backend", why);
    }
  }
#else
  if (backend_flag == "cuda") {
    spdlog::error("--backend=cuda: this samplerd is built without the CUDA backend");
    return 2;
  }
#endif
  if (backend == nullptr) {
    CpuBackendOptions cpu_options;
    cpu_options.num_threads = absl::GetFlag(FLAGS_threads);
    cpu_options.draft_pool = pool_options;
    auto cpu = CpuBackend::Create(cpu_options);
    if (!cpu.ok()) {
      spdlog::error("backend: {}", cpu.status().ToString());
      return 2;
    }
    backend = std::move(*cpu);
  }
  const std::string metrics_address = absl::GetFlag(FLAGS_metrics_address);
  // The gRPC listener's rule for plaintext off loopback, with its own explicit opt-out: the
  // metrics carry counts, never logits, and a NetworkPolicy may be all an operator wants.
  if (!metrics_address.empty() && !IsLoopbackAddress(metrics_address) &&
      !absl::GetFlag(FLAGS_allow_insecure_metrics)) {
    spdlog::error("--metrics_address={} is not a loopback address, and /metrics is plaintext "
                  "HTTP: say --allow_insecure_metrics if that is intended (a NetworkPolicy that "
                  "admits only the scraper), or serve it on 127.0.0.1",
                  metrics_address);
    return 2;
  }
  auto metrics = Metrics::Create(metrics_address);
  if (!metrics.ok()) {
    spdlog::error("{}", metrics.status().ToString());
    return 2;
  }
  auto allowed_uids = ParseUidList(absl::GetFlag(FLAGS_shm_allowed_uids));
  if (!allowed_uids.ok()) {
    spdlog::error("--shm_allowed_uids: {}", std::string(allowed_uids.status().message()));
    return 2;
  }
  MemoryBudget request_memory(absl::GetFlag(FLAGS_max_request_memory_bytes));
  BufferRegistryOptions registry_options;
  registry_options.device = device_memory.get();
  registry_options.shm.allowed_owners = *allowed_uids;
  BufferRegistry registry(registry_options);
  ServiceOptions options;
  options.request_memory = &request_memory;
  options.limits.max_rows = absl::GetFlag(FLAGS_max_rows);
  options.limits.max_vocab_size = absl::GetFlag(FLAGS_max_vocab_size);
  options.limits.max_top_logprobs = absl::GetFlag(FLAGS_max_top_logprobs);
  options.limits.max_force_top_n = absl::GetFlag(FLAGS_max_force_top_n);
  options.limits.max_token_list = absl::GetFlag(FLAGS_max_token_list);
  options.limits.max_context_token_rows = absl::GetFlag(FLAGS_max_context_token_rows);
  options.max_queued_steps = absl::GetFlag(FLAGS_max_queued_steps);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.registration_lease = absl::Milliseconds(absl::GetFlag(FLAGS_registration_lease_ms));
  const int max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);
  options.max_open_streams = absl::GetFlag(FLAGS_max_open_streams) > 0
                                 ? absl::GetFlag(FLAGS_max_open_streams)
                                 : std::max(1, max_rpc_threads - 16);
  options.max_streams_per_client = absl::GetFlag(FLAGS_max_streams_per_client);
  options.max_step_channels = absl::GetFlag(FLAGS_max_step_channels);
  options.max_channels_per_client = absl::GetFlag(FLAGS_max_channels_per_client);
  const ConnectionLedger::Limits connection_limits{absl::GetFlag(FLAGS_max_connections),
                                                   absl::GetFlag(FLAGS_max_connections_per_uid)};
  if (options.max_open_streams >= max_rpc_threads || options.max_streams_per_client < 1 ||
      options.max_step_channels < 1 || options.max_channels_per_client < 1 ||
      connection_limits.max_total < 1 || connection_limits.max_per_uid < 1) {
    spdlog::error("--max_open_streams must be below --max_rpc_threads ({}), and the stream, "
                  "channel and connection limits at least 1", max_rpc_threads);
    return 2;
  }
  const TlsFiles tls{absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file),
                     absl::GetFlag(FLAGS_tls_client_ca_file),
                     absl::GetFlag(FLAGS_tls_reload_interval_s),
                     absl::GetFlag(FLAGS_tls_state_dir)};
  const std::vector<std::string> allowed_clients = absl::GetFlag(FLAGS_tls_allowed_clients);
  if (!allowed_clients.empty() && tls.client_ca.empty()) {
    spdlog::error("--tls_allowed_clients: client identities need mutual TLS "
                  "(--tls_client_ca_file)");
    return 2;
  }
  options.access = AccessPolicy(allowed_clients, /*mutual_tls=*/!tls.client_ca.empty());
  // allowed_token_ids' masks are bounded per step as the grammar masks sent are.
  options.limits.max_step_mask_bytes = options.max_message_bytes;
  // Context-parallel groups: NCCL on the CUDA backend; none on the CPU backend.
  std::unique_ptr<GroupTransport> group_transport;
#ifdef SAMPLERD_WITH_CUDA
  if (device_memory != nullptr) {
    auto nccl = NcclTransport::Create(absl::GetFlag(FLAGS_cuda_device));
    if (nccl.ok()) {
      group_transport = std::move(*nccl);
    } else {
      spdlog::warn("context-parallel groups are off: {}", nccl.status().ToString());
    }
  }
#endif
  GroupRegistry::Options group_options;
  group_options.max_groups = absl::GetFlag(FLAGS_max_groups);
  group_options.max_logits_bytes = absl::GetFlag(FLAGS_max_group_logits_bytes);
  group_options.max_step_tokens = absl::GetFlag(FLAGS_max_rows);
  Metrics* metrics_ptr = metrics->get();
  metrics_ptr->SetMpsClient(backend->Info().mps);
  // A backend that can run no step again (a CUDA context lost to a sticky fault or to its MPS
  // server): drain as for SIGTERM and exit kExitBackendBroken, so the pod restarts samplerd
  // with a new context rather than keep a server that answers health but no step.
  options.on_backend_broken = [](const absl::Status& why) {
    if (g_backend_broken.exchange(true)) return;  // once
    spdlog::error("the backend can run no more steps ({}): draining, then exiting {}",
                  std::string(why.message()), kExitBackendBroken);
    kill(getpid(), SIGTERM);
  };
  // The watchdog: a context torn down while no step runs (under MPS, by another client's
  // fault) is noticed within the interval, so samplerd exits and the MPS server, which takes
  // no new client until every old one has gone, can serve the restarted worker and samplerd.
  std::atomic<bool> watchdog_stop{false};
  std::thread watchdog;
  const int check_ms = absl::GetFlag(FLAGS_context_check_interval_ms);
  if (backend->Info().name == "cuda" && check_ms > 0) {
    watchdog = std::thread([&backend, &watchdog_stop, &options, check_ms] {
      while (!watchdog_stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(check_ms));
        if (absl::Status broken = backend->Broken(); !broken.ok()) {
          options.on_backend_broken(broken);
          return;
        }
      }
    });
  }
  struct JoinWatchdog {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~JoinWatchdog() {
      stop.store(true);
      if (thread.joinable()) thread.join();
    }
  } join_watchdog{watchdog_stop, watchdog};
  GroupRegistry groups(group_transport.get(), group_options,
                       [metrics_ptr](const std::string&, const std::string&) {
                         metrics_ptr->CountGroupFailure();
                       });
  // Who each plaintext connection is (its uid), learnt at accept by the local listeners.
  PeerDirectory peers;
  options.peers = &peers;
  // How many connections the local listeners hold, bounded; the gauge refreshed each second.
  ConnectionLedger connections(connection_limits);
  PeriodicTask connection_gauge(absl::Seconds(1), [&connections, metrics_ptr] {
    const int open = connections.Sweep();
    metrics_ptr->SetConnections(open, connections.refused());
  });
  // Health says NOT_SERVING while no new stream can be opened (every stream slot is held),
  // and from SIGTERM on; the server is set once it exists.
  // One lock over both, so a stream slot freed during the drain cannot turn it back to SERVING.
  absl::Mutex health_mu;
  grpc::Server* health_server = nullptr;  // guarded by health_mu
  bool stopping = false;                  // guarded by health_mu
  options.on_accepting_streams = [&health_mu, &health_server, &stopping](bool accepting) {
    absl::MutexLock lock(&health_mu);
    grpc::Server* s = health_server;
    if (s == nullptr || stopping) return;
    s->GetHealthCheckService()->SetServingStatus(accepting);
    s->GetHealthCheckService()->SetServingStatus(kServiceName, accepting);
    spdlog::warn(accepting ? "streams free again: SERVING"
                           : "every stream slot is held (--max_open_streams): NOT_SERVING");
  };
  SamplerService service(*backend, registry, groups, **metrics, options, RandomSeedSource());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Bounds the memory of messages in flight and the threads calls may hold, over all clients.
  grpc::ResourceQuota quota("samplerd");
  quota.Resize(static_cast<size_t>(absl::GetFlag(FLAGS_max_inflight_message_bytes)));
  quota.SetMaxThreads(absl::GetFlag(FLAGS_max_rpc_threads));
  builder.SetResourceQuota(quota);
  const int max_bytes = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  int port = 0;
  int tls_port = 0;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  // Plaintext listeners are samplerd's own (server/local_listener.h): it learns each
  // connection's uid before the connection's first call. TLS stays gRPC's listener.
  std::vector<std::unique_ptr<LocalListener>> local_listeners;
  std::unique_ptr<TlsMirror> tls_mirror;  // TLS: the checked copies gRPC reads
  if (!listen.empty()) {
    auto credentials = ListenerCredentials(
        tls, listen, absl::GetFlag(FLAGS_allow_insecure_network),
        [metrics_ptr](const absl::Status&) { metrics_ptr->CountTlsReloadFailure(); });
    if (!credentials.ok()) {
      spdlog::error("{}", std::string(credentials.status().message()));
      return 2;
    }
    if (tls.cert.empty()) {
      auto tcp = LocalListener::Bind(listen, 0);
      if (!tcp.ok()) {
        spdlog::error("{}", std::string(tcp.status().message()));
        return 1;
      }
      port = (*tcp)->port();
      local_listeners.push_back(std::move(*tcp));
    } else {
      // The TLS listener is gRPC's, so LocalListener's connection limits do not apply to it;
      // what bounds a peer that connects and never completes a handshake (no certificate, or
      // none at all) is this timeout.
      builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                                 std::max(1, absl::GetFlag(FLAGS_tls_handshake_timeout_ms)));
      builder.AddListeningPort(listen, credentials->credentials, &tls_port);
      tls_mirror = std::move(credentials->mirror);
    }
  }
  const std::string unix_socket = absl::GetFlag(FLAGS_unix_socket);
  if (!unix_socket.empty()) {
    const std::string text = absl::GetFlag(FLAGS_unix_socket_mode);
    char* end = nullptr;
    const unsigned long mode = std::strtoul(text.c_str(), &end, 8);
    if (text.empty() || *end != '\0' || mode > 0777) {
      spdlog::error("--unix_socket_mode: '{}' is not an octal file mode",
                    absl::GetFlag(FLAGS_unix_socket_mode));
      return 2;
    }
    auto socket = LocalListener::Bind("unix:" + unix_socket, static_cast<mode_t>(mode));
    if (!socket.ok()) {
      spdlog::error("{}", std::string(socket.status().message()));
      return 1;
    }
    local_listeners.push_back(std::move(*socket));
  }
  if (listen.empty() && unix_socket.empty()) {
    spdlog::error("nothing to listen on: set --listen or --unix_socket");
    return 2;
  }
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!tls.cert.empty() && !listen.empty() && tls_port == 0)) {
    spdlog::error("cannot listen on {}", listen.empty() ? unix_socket : listen);
    return 1;
  }
  if (tls_port != 0) port = tls_port;
  service.SetTlsPort(tls_port);
  for (auto& listener : local_listeners) listener->Start(server.get(), &peers, &connections);
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  {
    absl::MutexLock lock(&health_mu);
    health->SetServingStatus(true);
    health->SetServingStatus(kServiceName, true);
    health_server = server.get();
  }
  const BackendInfo info = backend->Info();
  spdlog::info("samplerd {} serving on {}{}{} (port {}), backend {} ({}), metrics {}",
               options.version, listen,
               tls.cert.empty() ? "" : (tls.client_ca.empty() ? " (TLS)" : " (mutual TLS)"),
               unix_socket.empty() ? "" : " and unix:" + unix_socket,
               port, info.name, info.device,
               (*metrics)->port() ? absl::StrCat("on port ", (*metrics)->port()) : "off");
  spdlog::info("limits: max_rows {} max_vocab_size {} max_top_logprobs {} max_message_bytes {} "
               "max_queued_steps {}",
               options.limits.max_rows, options.limits.max_vocab_size,
               options.limits.max_top_logprobs, options.max_message_bytes,
               options.max_queued_steps);
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    // Written whole under a temporary name, then renamed, so readers never see a partial file.
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n" << (*metrics)->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }

  // Signals were blocked before any thread started; this thread alone waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received {}: draining", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  {
    absl::MutexLock lock(&health_mu);
    stopping = true;
    health->SetServingStatus(false);
    health->SetServingStatus(kServiceName, false);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  // No new connections from here on; those open are drained by Shutdown.
  for (auto& listener : local_listeners) listener->Stop();
  service.StartDraining();
  // Shutdown waits for every open call: a stream whose worker sends no more steps is ended
  // after --drain_idle_stream_ms rather than at the deadline.
  absl::Notification drained;
  std::thread idle_streams([&service, &drained] {
    if (!drained.WaitForNotificationWithTimeout(
            absl::Milliseconds(absl::GetFlag(FLAGS_drain_idle_stream_ms)))) {
      service.CancelIdleStreams();
    }
  });
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_deadline_ms)));
  server->Wait();
  drained.Notify();
  idle_streams.join();
  // Groups last: steps that held one have been answered; followers get a closing packet.
  groups.Shutdown(absl::Seconds(2));
  spdlog::info("samplerd stopped: {} steps read, {} answered", service.steps_read(),
               service.steps_answered());
  return g_backend_broken.load() ? kExitBackendBroken : 0;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  // Block SIGTERM/SIGINT before gRPC starts its threads, so they inherit the mask and the
  // main thread receives them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::SetProgramUsageMessage(
      "the samplerd sampling server (gRPC; default: the CPU backend on 127.0.0.1:50051)");
  // `--help` lists this file's flags (Abseil's default looks for a file named after the
  // program, and found none: "No flags matched").
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  // gRPC's built-in health service has no C++ descriptors, so reflection listed
  // grpc.health.v1.Health but could not describe it (`grpcurl ... grpc.health.v1.Health/Check`
  // failed). Linking the generated health.proto puts it in the descriptor pool reflection reads.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  absl::ParseCommandLine(argc, argv);
  // A bounded number of malloc arenas, set before any thread starts. glibc's default (up to 8
  // per core) lets freed multi-megabyte blocks of inline logits stay cached in many arenas, so
  // RSS crept up under bursts of large messages (0.73 GiB at 2 s to 1.05 GiB at 15 s under 32
  // streams of 8.3 MB steps). Too few arenas serialise every allocation of concurrent steps:
  // with 2, 16 streams of R = 16 on the CUDA backend ran at 14,753 steps/s and 29,159 with 16
  // (H200 machine, same run; the host work around the kernels went from 144 to 45 us p50).
  mallopt(M_ARENA_MAX, std::max(1, absl::GetFlag(FLAGS_malloc_arenas)));
  return samplerd::Serve();
}
