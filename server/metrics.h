// Prometheus metrics of samplerd, served over HTTP on their own address (prometheus-cpp).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics, Metrics::Create("127.0.0.1:9464"));
//   metrics->ObserveStep(StepKind::kDecode, seconds, rows, requests);
//
// Families: samplerd_step_seconds{kind} (histogram), samplerd_rows_total{kind},
// samplerd_requests_total{kind}, samplerd_errors_total{code} (step and request faults),
// samplerd_steps_in_flight, samplerd_registered_buffers, samplerd_group_failures_total
// (context-parallel groups aborted after an error, a missed deadline or a join timeout),
// samplerd_tls_reload_failures_total, samplerd_tracked_clients, samplerd_mps_client,
// samplerd_connections, samplerd_connections_refused_total.
// Thread-safe.
#ifndef SAMPLERD_SERVER_METRICS_H_
#define SAMPLERD_SERVER_METRICS_H_

#include <array>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sampler/types.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace samplerd {

class Metrics final {
 public:
  // `address` "host:port" (port 0 picks one) serves /metrics; empty serves nothing (the
  // counters still count). Errors: UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& address);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  void ObserveStep(StepKind kind, double seconds, int64_t rows, int64_t requests);
  void CountError(absl::StatusCode code);
  void AddInFlight(double delta);
  // Registered regions and the bytes they (and cached one-off CUDA IPC allocations) hold.
  void SetRegisteredBuffers(int count, int64_t bytes);
  // Co-located workers' step channels open now.
  void SetStepChannels(int count);
  // SampleStream calls open now (+1 when one starts, -1 when it ends): with the step rate, the
  // "streams open, no steps" alert of deploy/monitoring.
  void AddOpenStreams(double delta);
  // Regions released because their owner was gone; `why`: "lease_expired", "stream_dropped"
  // or "taken_over".
  void CountReleasedBuffers(const char* why, int count);
  void CountGroupFailure();
  // 1 when samplerd's CUDA context is an MPS client.
  void SetMpsClient(bool mps);
  // Clients that own registrations or step channels now (their lease entries).
  void SetTrackedClients(int count);
  // A TLS re-read that found an unusable key or certificate (server/tls_listener.h).
  void CountTlsReloadFailure();
  // The connections samplerd's own listeners hold now, and how many they have refused in all
  // (ConnectionLedger: --max_connections, --max_connections_per_uid).
  void SetConnections(int open, int64_t refused_total);
  // civetweb's read and write timeout for a metrics client.
  static constexpr int kMetricsRequestTimeoutMs = 1000;
  // The bound HTTP port, or 0 when not serving.
  int port() const { return port_; }

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::array<prometheus::Histogram*, 3> step_seconds_{};
  std::array<prometheus::Counter*, 3> rows_{};
  std::array<prometheus::Counter*, 3> requests_{};
  prometheus::Family<prometheus::Counter>* errors_ = nullptr;
  prometheus::Gauge* in_flight_ = nullptr;
  prometheus::Gauge* buffers_ = nullptr;
  prometheus::Gauge* buffer_bytes_ = nullptr;
  prometheus::Gauge* step_channels_ = nullptr;
  prometheus::Gauge* open_streams_ = nullptr;
  prometheus::Family<prometheus::Counter>* released_ = nullptr;
  prometheus::Counter* group_failures_ = nullptr;
  prometheus::Counter* tls_reload_failures_ = nullptr;
  prometheus::Gauge* tracked_clients_ = nullptr;
  prometheus::Gauge* mps_client_ = nullptr;
  prometheus::Gauge* connections_ = nullptr;
  prometheus::Counter* connections_refused_ = nullptr;
  absl::Mutex mu_;  // guards adding labelled children to errors_, and refused_counted_
  int64_t refused_counted_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_METRICS_H_
