#include "server/tls_listener.h"

#include <arpa/inet.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace samplerd {
namespace {

// The file must be readable and hold a PEM block: caught at startup, not at the first
// handshake (gRPC's file watcher would only log it, and every handshake would fail).
absl::Status CheckPemFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM block"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackAddress(absl::string_view address) {
  // gRPC's scheme-qualified forms name the same hosts.
  if (!absl::ConsumePrefix(&address, "ipv4:")) absl::ConsumePrefix(&address, "ipv6:");
  const size_t colon = address.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? address : address.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]")) return false;
  }
  if (host == "localhost") return true;
  const std::string h(host);
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenerCredentials(
    const TlsFiles& tls, absl::string_view address, bool allow_insecure_network) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file: give both (the certificate and its key) or neither");
  }
  if (tls.cert.empty()) {
    if (!tls.client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca_file: client certificates need TLS (--tls_cert_file, --tls_key_file)");
    }
    if (!IsLoopbackAddress(address) && !allow_insecure_network) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen=", address, " is not a loopback address and TLS is off: logits and tokens "
          "would cross the network in clear to any client. Serve TLS (--tls_cert_file, "
          "--tls_key_file, and --tls_client_ca_file for mutual TLS), or say "
          "--allow_insecure_network if something else (a mesh's sidecar) encrypts the traffic"));
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.reload_interval_s < 1) {
    return absl::InvalidArgumentError("--tls_reload_interval_s: must be at least 1");
  }
  if (absl::Status s = CheckPemFile(tls.cert, "--tls_cert_file"); !s.ok()) return s;
  if (absl::Status s = CheckPemFile(tls.key, "--tls_key_file"); !s.ok()) return s;
  if (!tls.client_ca.empty()) {
    if (absl::Status s = CheckPemFile(tls.client_ca, "--tls_client_ca_file"); !s.ok()) return s;
  }
  // The provider re-reads the files every interval; a new pair applies to new handshakes only.
  // The key and certificate must change together, atomically: a Secret volume's files do (the
  // kubelet swaps a symlink to a new directory).
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key, tls.cert, tls.client_ca, static_cast<unsigned int>(tls.reload_interval_s));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace samplerd
