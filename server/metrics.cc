#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <exception>

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

int KindIndex(StepKind kind) { return static_cast<int>(kind); }

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& address) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Registry& registry = *metrics->registry_;
  auto& seconds = prometheus::BuildHistogram()
                      .Name("samplerd_step_seconds")
                      .Help("Time from receiving a step to its answer, by step kind")
                      .Register(registry);
  auto& rows = prometheus::BuildCounter()
                   .Name("samplerd_rows_total")
                   .Help("Logits rows sampled, by step kind")
                   .Register(registry);
  auto& requests = prometheus::BuildCounter()
                       .Name("samplerd_requests_total")
                       .Help("Requests answered, by step kind")
                       .Register(registry);
  const prometheus::Histogram::BucketBoundaries buckets = {
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0};
  for (StepKind kind : {StepKind::kPrefill, StepKind::kDecode, StepKind::kDraft}) {
    const prometheus::Labels labels = {{"kind", StepKindName(kind)}};
    metrics->step_seconds_[KindIndex(kind)] = &seconds.Add(labels, buckets);
    metrics->rows_[KindIndex(kind)] = &rows.Add(labels);
    metrics->requests_[KindIndex(kind)] = &requests.Add(labels);
  }
  metrics->errors_ = &prometheus::BuildCounter()
                          .Name("samplerd_errors_total")
                          .Help("Failed steps and failed requests, by gRPC status code")
                          .Register(registry);
  // Series that exist from the start read 0, not "no data", in rates, ratios and alerts
  // (deploy/monitoring); other codes appear when they first occur.
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kUnavailable, absl::StatusCode::kPermissionDenied,
        absl::StatusCode::kInternal}) {
    metrics->errors_->Add({{"code", absl::StatusCodeToString(code)}});
  }
  metrics->in_flight_ = &prometheus::BuildGauge()
                             .Name("samplerd_steps_in_flight")
                             .Help("Steps received and not yet answered")
                             .Register(registry)
                             .Add({});
  metrics->buffers_ = &prometheus::BuildGauge()
                           .Name("samplerd_registered_buffers")
                           .Help("Registered logits regions")
                           .Register(registry)
                           .Add({});
  metrics->step_channels_ = &prometheus::BuildGauge()
                                  .Name("samplerd_step_channels")
                                  .Help("Co-located workers' shared-memory step channels open")
                                  .Register(registry)
                                  .Add({});
  metrics->open_streams_ = &prometheus::BuildGauge()
                                 .Name("samplerd_open_streams")
                                 .Help("SampleStream calls open (each a worker's step loop)")
                                 .Register(registry)
                                 .Add({});
  metrics->buffer_bytes_ = &prometheus::BuildGauge()
                                .Name("samplerd_registered_buffer_bytes")
                                .Help("Bytes of the registered regions and cached one-off CUDA "
                                      "IPC allocations")
                                .Register(registry)
                                .Add({});
  metrics->released_ = &prometheus::BuildCounter()
                            .Name("samplerd_released_buffers_total")
                            .Help("Regions released because their owner was gone, by why "
                                  "(lease_expired, stream_dropped, taken_over)")
                            .Register(registry);
  for (const char* why : {"lease_expired", "stream_dropped", "taken_over"}) {
    metrics->released_->Add({{"why", why}});
  }
  metrics->tracked_clients_ = &prometheus::BuildGauge()
                                   .Name("samplerd_tracked_clients")
                                   .Help("Clients that own registered buffers or step channels")
                                   .Register(registry)
                                   .Add({});
  metrics->mps_client_ = &prometheus::BuildGauge()
                              .Name("samplerd_mps_client")
                              .Help("1 when samplerd's CUDA context is an MPS client")
                              .Register(registry)
                              .Add({});
  metrics->tls_reload_failures_ =
      &prometheus::BuildCounter()
           .Name("samplerd_tls_reload_failures_total")
           .Help("TLS re-reads that found an unusable key or certificate (the last good pair "
                 "kept serving)")
           .Register(registry)
           .Add({});
  metrics->connections_ = &prometheus::BuildGauge()
                               .Name("samplerd_connections")
                               .Help("Connections samplerd's own listeners hold (TCP without "
                                     "TLS, the unix socket), as of the last sweep")
                               .Register(registry)
                               .Add({});
  metrics->connections_refused_ =
      &prometheus::BuildCounter()
           .Name("samplerd_connections_refused_total")
           .Help("Connections closed at accept: over --max_connections or "
                 "--max_connections_per_uid")
           .Register(registry)
           .Add({});
  metrics->group_failures_ =
      &prometheus::BuildCounter()
           .Name("samplerd_group_failures_total")
           .Help("Context-parallel groups aborted (error, missed deadline or join timeout)")
           .Register(registry)
           .Add({});
  if (!address.empty()) {
    try {
      // Slow or idle clients are cut off after a second (issue 45: two half-sent requests held
      // both of civetweb's default threads, and every scrape waited over 5 s); a few threads
      // more than a scraper needs.
      metrics->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
          "listening_ports", address, "num_threads", "4", "request_timeout_ms",
          std::to_string(kMetricsRequestTimeoutMs), "enable_keep_alive", "no"});
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics_address: cannot serve metrics on ", address, ": ", e.what()));
    }
    metrics->exposer_->RegisterCollectable(metrics->registry_);
    const std::vector<int> ports = metrics->exposer_->GetListeningPorts();
    metrics->port_ = ports.empty() ? 0 : ports[0];
  }
  return metrics;
}

Metrics::~Metrics() = default;

void Metrics::SetMpsClient(bool mps) { mps_client_->Set(mps ? 1 : 0); }

void Metrics::SetTrackedClients(int count) { tracked_clients_->Set(count); }

void Metrics::CountTlsReloadFailure() { tls_reload_failures_->Increment(); }

void Metrics::SetConnections(int open, int64_t refused_total) {
  connections_->Set(open);
  absl::MutexLock lock(&mu_);
  if (refused_total > refused_counted_) {
    connections_refused_->Increment(static_cast<double>(refused_total - refused_counted_));
    refused_counted_ = refused_total;
  }
}

void Metrics::ObserveStep(StepKind kind, double seconds, int64_t rows, int64_t requests) {
  step_seconds_[KindIndex(kind)]->Observe(seconds);
  rows_[KindIndex(kind)]->Increment(static_cast<double>(rows));
  requests_[KindIndex(kind)]->Increment(static_cast<double>(requests));
}

void Metrics::CountError(absl::StatusCode code) {
  absl::MutexLock lock(&mu_);
  errors_->Add({{"code", absl::StatusCodeToString(code)}}).Increment();
}

void Metrics::AddInFlight(double delta) { in_flight_->Increment(delta); }

void Metrics::SetRegisteredBuffers(int count, int64_t bytes) {
  buffers_->Set(count);
  buffer_bytes_->Set(static_cast<double>(bytes));
}

void Metrics::SetStepChannels(int count) { step_channels_->Set(count); }

void Metrics::AddOpenStreams(double delta) { open_streams_->Increment(delta); }

void Metrics::CountReleasedBuffers(const char* why, int count) {
  absl::MutexLock lock(&mu_);  // Add may create the labelled child
  released_->Add({{"why", why}}).Increment(count);
}

void Metrics::CountGroupFailure() { group_failures_->Increment(); }

}  // namespace samplerd
