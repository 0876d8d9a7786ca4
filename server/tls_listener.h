// The credentials of samplerd's TCP listener (issue 31): TLS, mutual when a client CA is
// given, from PEM files that are re-read periodically (a Kubernetes Secret rotated by
// cert-manager takes effect for new connections; open connections and their streams keep the
// session they have), or plaintext. Plaintext off loopback is refused unless the operator says
// so explicitly.
//
// gRPC is never handed the operator's files directly (issue 45: a re-read that caught a file
// between truncate and write gave gRPC an empty key, and its assertion aborted samplerd).
// TlsMirror reads them, checks them (PEM that parses, a key that matches its certificate, a
// CA bundle of certificates) and publishes each good set into a private directory that gRPC's
// file watcher reads; a bad set is logged and counted, and the last good one keeps serving.
//
//   TlsFiles tls{"/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt"};
//   ASSIGN_OR_RETURN(auto listener, ListenerCredentials(tls, "0.0.0.0:50051", false));
//   builder.AddListeningPort("0.0.0.0:50051", listener.credentials, &port);
//   // keep listener.mirror alive as long as the server
#ifndef SAMPLERD_SERVER_TLS_LISTENER_H_
#define SAMPLERD_SERVER_TLS_LISTENER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/server_credentials.h"

namespace samplerd {

struct TlsFiles {
  std::string cert;       // the server's certificate chain (PEM); empty = plaintext
  std::string key;        // its private key (PEM)
  std::string client_ca;  // CA bundle that client certificates must chain to; empty = no mTLS
  int reload_interval_s = 60;
  // Where the checked copies gRPC reads are kept (a private directory is made inside it);
  // empty: $TMPDIR, else /tmp. Must be writable (a read-only root filesystem needs a volume).
  std::string state_dir;
};

// A checked copy of the TLS files for gRPC's file watcher (see the top of this file).
class TlsMirror {
 public:
  // Checks the files (INVALID_ARGUMENT naming the flag) and publishes them. `on_refused` is
  // called with the reason whenever a re-read finds an unusable set.
  static absl::StatusOr<std::unique_ptr<TlsMirror>> Create(
      const TlsFiles& files, std::function<void(const absl::Status&)> on_refused);
  // Stops re-reading and removes the private directory.
  ~TlsMirror();
  TlsMirror(const TlsMirror&) = delete;
  TlsMirror& operator=(const TlsMirror&) = delete;

  // What gRPC's watcher reads (through a link swapped atomically to each published set).
  std::string key_path() const { return dir_ + "/current/tls.key"; }
  std::string cert_path() const { return dir_ + "/current/tls.crt"; }
  std::string ca_path() const { return dir_ + "/current/ca.crt"; }
  // Re-reads the files now: OK when they were published or unchanged, else why they were
  // refused (the last good set stays). The thread calls it every reload_interval_s.
  absl::Status Refresh();
  // Sets published so far (the first at Create).
  int published() const;
  // Re-reads every reload_interval_s on a thread of its own from now on.
  void Start();

 private:
  TlsMirror(TlsFiles files, std::string dir, std::function<void(const absl::Status&)> on_refused);
  absl::Status Publish(const std::string& cert, const std::string& key, const std::string& ca);

  const TlsFiles files_;
  const std::string dir_;
  const std::function<void(const absl::Status&)> on_refused_;
  mutable absl::Mutex mu_;
  std::string cert_ ABSL_GUARDED_BY(mu_), key_ ABSL_GUARDED_BY(mu_), ca_ ABSL_GUARDED_BY(mu_);
  int published_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Whether `cert_pem` (a chain, leaf first) and `key_pem` are a usable pair: both parse, and
// the key is the leaf's. INVALID_ARGUMENT naming `cert_flag` or `key_flag` otherwise.
absl::Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem,
                          absl::string_view cert_flag, absl::string_view key_flag);
// Whether `pem` holds at least one certificate and nothing unparseable.
absl::Status CheckCertificates(const std::string& pem, absl::string_view flag);

struct ListenerSetup {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::unique_ptr<TlsMirror> mirror;  // TLS: keeps the files gRPC reads; null for plaintext
};

// The listener's credentials for `address`, or INVALID_ARGUMENT naming the flag at fault: a
// certificate without its key (or the reverse), a client CA without a certificate, a file that
// cannot be read or does not parse, a key that is not the certificate's, or plaintext on a
// non-loopback address without `allow_insecure_network`. `on_refused`: TlsMirror's.
absl::StatusOr<ListenerSetup> ListenerCredentials(
    const TlsFiles& tls, absl::string_view address, bool allow_insecure_network,
    std::function<void(const absl::Status&)> on_refused = nullptr);

// Whether host:port names a loopback host (localhost, 127.0.0.0/8, ::1). Wildcards (0.0.0.0,
// [::]) and every other host are not.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_TLS_LISTENER_H_
