#include "server/tls_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace samplerd {
namespace {

// The whole file, or INVALID_ARGUMENT naming `flag`.
absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// OpenSSL's last error, for a message.
std::string SslError() {
  char text[256] = {0};
  ERR_error_string_n(ERR_get_error(), text, sizeof(text));
  ERR_clear_error();
  return text;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

// The certificates of `pem`, in order; an error naming `flag` for none, or for a block that
// does not parse (a file caught half-written).
absl::StatusOr<std::vector<std::unique_ptr<X509, X509Free>>> ParseCertificates(
    const std::string& pem, absl::string_view flag) {
  std::vector<std::unique_ptr<X509, X509Free>> out;
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  for (;;) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (cert == nullptr) break;
    out.emplace_back(cert);
  }
  const unsigned long last = ERR_peek_last_error();
  // The normal end of the input reads as "no start line"; anything else is damage.
  if (last != 0 && !(ERR_GET_LIB(last) == ERR_LIB_PEM &&
                     ERR_GET_REASON(last) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": a certificate does not parse: ", SslError()));
  }
  ERR_clear_error();
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": holds no PEM certificate"));
  }
  return out;
}

}  // namespace

absl::Status CheckCertificates(const std::string& pem, absl::string_view flag) {
  return ParseCertificates(pem, flag).status();
}

absl::Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem,
                          absl::string_view cert_flag, absl::string_view key_flag) {
  auto chain = ParseCertificates(cert_pem, cert_flag);
  if (!chain.ok()) return chain.status();
  std::unique_ptr<BIO, BioFree> bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, ": holds no private key that parses: ", SslError()));
  }
  if (X509_check_private_key(chain->front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, ": the private key is not the key of the certificate in ", cert_flag,
        " (every handshake would fail)"));
  }
  return absl::OkStatus();
}

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

TlsMirror::TlsMirror(TlsFiles files, std::string dir,
                     std::function<void(const absl::Status&)> on_refused)
    : files_(std::move(files)), dir_(std::move(dir)), on_refused_(std::move(on_refused)) {}

absl::StatusOr<std::unique_ptr<TlsMirror>> TlsMirror::Create(
    const TlsFiles& files, std::function<void(const absl::Status&)> on_refused) {
  std::string parent = files.state_dir;
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string pattern = parent + "/samplerd-tls-XXXXXX";  // mkdtemp: mode 0700
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_state_dir: cannot make a private directory in ", parent, ": ",
        std::strerror(errno), " (it holds the checked copies of the TLS files gRPC reads)"));
  }
  std::unique_ptr<TlsMirror> mirror(new TlsMirror(files, pattern, std::move(on_refused)));
  if (absl::Status first = mirror->Refresh(); !first.ok()) return first;
  return mirror;
}

TlsMirror::~TlsMirror() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void TlsMirror::Start() {
  thread_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_),
                                 absl::Seconds(files_.reload_interval_s))) {
      mu_.Unlock();
      const absl::Status refreshed = Refresh();
      if (!refreshed.ok()) {
        spdlog::warn("TLS files refused, the last good ones keep serving: {}",
                     std::string(refreshed.message()));
        if (on_refused_) on_refused_(refreshed);
      }
      mu_.Lock();
    }
  });
}

int TlsMirror::published() const {
  absl::MutexLock lock(&mu_);
  return published_;
}

absl::Status TlsMirror::Refresh() {
  auto cert = ReadFile(files_.cert, "--tls_cert_file");
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(files_.key, "--tls_key_file");
  if (!key.ok()) return key.status();
  std::string ca;
  if (!files_.client_ca.empty()) {
    auto read = ReadFile(files_.client_ca, "--tls_client_ca_file");
    if (!read.ok()) return read.status();
    ca = *std::move(read);
  }
  {
    absl::MutexLock lock(&mu_);
    if (published_ > 0 && *cert == cert_ && *key == key_ && ca == ca_) return absl::OkStatus();
  }
  if (absl::Status s = CheckKeyPair(*cert, *key, "--tls_cert_file", "--tls_key_file"); !s.ok()) {
    return s;
  }
  if (!files_.client_ca.empty()) {
    if (absl::Status s = CheckCertificates(ca, "--tls_client_ca_file"); !s.ok()) return s;
  }
  return Publish(*cert, *key, ca);
}

absl::Status TlsMirror::Publish(const std::string& cert, const std::string& key,
                                const std::string& ca) {
  absl::MutexLock lock(&mu_);
  const int generation = published_ + 1;
  const std::string dir = absl::StrCat(dir_, "/gen-", generation);
  auto write_file = [](const std::string& path, const std::string& text) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    return close(fd) == 0 && ok;
  };
  if (mkdir(dir.c_str(), 0700) != 0 || !write_file(dir + "/tls.crt", cert) ||
      !write_file(dir + "/tls.key", key) || !write_file(dir + "/ca.crt", ca)) {
    return absl::InternalError(absl::StrCat("--tls_state_dir: cannot write ", dir, ": ",
                                            std::strerror(errno)));
  }
  // One rename swaps the whole set: gRPC's watcher never reads a key of one set and the
  // certificate of another from what it has been given.
  const std::string link = dir_ + "/current.tmp";
  unlink(link.c_str());
  if (symlink(absl::StrCat("gen-", generation).c_str(), link.c_str()) != 0 ||
      rename(link.c_str(), (dir_ + "/current").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--tls_state_dir: cannot publish ", dir, ": ",
                                            std::strerror(errno)));
  }
  // The set before the last stays a while for a watcher reading through the old link.
  std::error_code ignored;
  if (generation > 2) {
    std::filesystem::remove_all(absl::StrCat(dir_, "/gen-", generation - 2), ignored);
  }
  cert_ = cert;
  key_ = key;
  ca_ = ca;
  published_ = generation;
  return absl::OkStatus();
}

absl::StatusOr<ListenerSetup> ListenerCredentials(
    const TlsFiles& tls, absl::string_view address, bool allow_insecure_network,
    std::function<void(const absl::Status&)> on_refused) {
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
    return ListenerSetup{grpc::InsecureServerCredentials(), nullptr};
  }
  if (tls.reload_interval_s < 1) {
    return absl::InvalidArgumentError("--tls_reload_interval_s: must be at least 1");
  }
  auto mirror = TlsMirror::Create(tls, std::move(on_refused));
  if (!mirror.ok()) return mirror.status();
  // gRPC's watcher reads only the checked copies, every second (they change only when a good
  // set is published); a new pair applies to new handshakes only.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      (*mirror)->key_path(), (*mirror)->cert_path(),
      tls.client_ca.empty() ? "" : (*mirror)->ca_path(), 1);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  ListenerSetup setup{grpc::experimental::TlsServerCredentials(options), *std::move(mirror)};
  setup.mirror->Start();
  return setup;
}

}  // namespace samplerd
