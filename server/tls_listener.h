// The credentials of samplerd's TCP listener (issue 31): TLS, mutual when a client CA is
// given, from PEM files that are re-read periodically (a Kubernetes Secret rotated by
// cert-manager takes effect for new connections; open connections and their streams keep the
// session they have), or plaintext. Plaintext off loopback is refused unless the operator says
// so explicitly.
//
//   TlsFiles tls{"/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt"};
//   ASSIGN_OR_RETURN(auto credentials, ListenerCredentials(tls, "0.0.0.0:50051", false));
//   builder.AddListeningPort("0.0.0.0:50051", credentials, &port);
#ifndef SAMPLERD_SERVER_TLS_LISTENER_H_
#define SAMPLERD_SERVER_TLS_LISTENER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"

namespace samplerd {

struct TlsFiles {
  std::string cert;       // the server's certificate chain (PEM); empty = plaintext
  std::string key;        // its private key (PEM)
  std::string client_ca;  // CA bundle that client certificates must chain to; empty = no mTLS
  int reload_interval_s = 60;
};

// The listener's credentials for `address`, or INVALID_ARGUMENT naming the flag at fault: a
// certificate without its key (or the reverse), a client CA without a certificate, a file that
// cannot be read or holds no PEM block, or plaintext on a non-loopback address without
// `allow_insecure_network`.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenerCredentials(
    const TlsFiles& tls, absl::string_view address, bool allow_insecure_network);

// Whether host:port names a loopback host (localhost, 127.0.0.0/8, ::1). Wildcards (0.0.0.0,
// [::]) and every other host are not.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TLS_LISTENER_H_
