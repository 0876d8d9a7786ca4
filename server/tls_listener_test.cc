#include "server/tls_listener.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace samplerd {
namespace {

using ::testing::HasSubstr;

TEST(IsLoopbackAddress, LoopbackHostsOnly) {
  for (const char* address : {"127.0.0.1:50051", "127.1.2.3:0", "localhost:50051", "[::1]:50051",
                              "ipv4:127.0.0.1:5", "ipv6:[::1]:5"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "10.0.0.7:50051", "samplerd:50051",
                              ":50051", "128.0.0.1:1", "[::2]:1", "[::1:1", "localhost.evil:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

TEST(ListenerCredentials, PlaintextOnlyOnLoopbackUnlessAllowed) {
  EXPECT_TRUE(ListenerCredentials({}, "127.0.0.1:0", false).ok());
  const auto refused = ListenerCredentials({}, "0.0.0.0:50051", false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--allow_insecure_network"));
  EXPECT_TRUE(ListenerCredentials({}, "0.0.0.0:50051", true).ok());
}

// A self-signed P-256 certificate and its key, PEM.
struct Pair {
  std::string cert, key;
};
Pair MakePair(const std::string& name) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* subject = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, subject);
  X509_sign(cert, key, EVP_sha256());
  auto pem = [](auto write) {
    BIO* bio = BIO_new(BIO_s_mem());
    write(bio);
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    std::string out(data, static_cast<size_t>(n));
    BIO_free(bio);
    return out;
  };
  Pair pair{pem([&](BIO* b) { PEM_write_bio_X509(b, cert); }),
            pem([&](BIO* b) { PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr,
                                                       nullptr); })};
  X509_free(cert);
  EVP_PKEY_free(key);
  return pair;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc | std::ios::binary) << text;
}

TEST(ListenerCredentials, NamesTheFlagAtFault) {
  const std::string dir = ::testing::TempDir();
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem", junk = dir + "/junk.pem",
                    fake = dir + "/fake.pem", other_key = dir + "/other.key";
  const Pair pair = MakePair("a"), other = MakePair("b");
  Write(cert, pair.cert);
  Write(key, pair.key);
  Write(other_key, other.key);
  Write(junk, "not a certificate\n");
  Write(fake, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  auto message = [&](std::string c, std::string k, std::string client_ca,
                     int reload_interval_s = 60) {
    TlsFiles tls;
    tls.cert = c;
    tls.key = k;
    tls.client_ca = client_ca;
    tls.reload_interval_s = reload_interval_s;
    tls.state_dir = dir;
    return std::string(ListenerCredentials(tls, "0.0.0.0:1", false).status().message());
  };
  EXPECT_THAT(message(cert, "", ""), HasSubstr("--tls_key_file"));
  EXPECT_THAT(message("", cert, ""), HasSubstr("--tls_cert_file"));
  EXPECT_THAT(message("", "", cert), HasSubstr("--tls_client_ca_file"));
  EXPECT_THAT(message(dir + "/missing.pem", key, ""), HasSubstr("--tls_cert_file: cannot read"));
  EXPECT_THAT(message(cert, junk, ""), HasSubstr("--tls_key_file: "));
  EXPECT_THAT(message(fake, key, ""), HasSubstr("--tls_cert_file: "));
  EXPECT_THAT(message(cert, key, junk), HasSubstr("--tls_client_ca_file: "));
  EXPECT_THAT(message(cert, key, "", 0), HasSubstr("--tls_reload_interval_s"));
  // Issue 45: a key that is not the certificate's was accepted, then every handshake failed.
  EXPECT_THAT(message(cert, other_key, ""), HasSubstr("is not the key of the certificate"));
  EXPECT_EQ(message(cert, key, cert), "");
}

// Issue 45: a re-read that caught a file between truncate and write handed gRPC an empty key
// and samplerd aborted (SIGABRT, exit 134). Each unusable set is refused, counted, and the
// last good one stays published; a good rotation is published.
TEST(TlsMirror, RefusesUnusableSetsAndKeepsTheLastGoodOne) {
  const std::string dir = ::testing::TempDir() + "/mirror";
  mkdir(dir.c_str(), 0700);
  const Pair first = MakePair("first"), second = MakePair("second");
  TlsFiles files;
  files.cert = dir + "/tls.crt";
  files.key = dir + "/tls.key";
  files.client_ca = dir + "/ca.crt";
  files.state_dir = dir;
  Write(files.cert, first.cert);
  Write(files.key, first.key);
  Write(files.client_ca, first.cert);
  int refused = 0;
  auto mirror = TlsMirror::Create(files, [&](const absl::Status&) { ++refused; });
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  EXPECT_EQ((*mirror)->published(), 1);
  auto published = [&](const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  EXPECT_EQ(published((*mirror)->key_path()), first.key);
  const struct {
    const char* what;
    std::string cert, key, ca;
  } bad[] = {
      {"empty key", first.cert, "", first.cert},
      {"empty certificate", "", first.key, first.cert},
      {"half-written key", first.cert, first.key.substr(0, first.key.size() / 2), first.cert},
      {"half-written certificate", first.cert.substr(0, first.cert.size() / 2), first.key,
       first.cert},
      {"another certificate's key", first.cert, second.key, first.cert},
      {"empty CA bundle", first.cert, first.key, ""},
  };
  for (const auto& b : bad) {
    Write(files.cert, b.cert);
    Write(files.key, b.key);
    Write(files.client_ca, b.ca);
    EXPECT_FALSE((*mirror)->Refresh().ok()) << b.what;
    EXPECT_EQ((*mirror)->published(), 1) << b.what;
    EXPECT_EQ(published((*mirror)->key_path()), first.key) << b.what;
    EXPECT_EQ(published((*mirror)->cert_path()), first.cert) << b.what;
  }
  // A rotation (certificate, key and CA together) is published; unchanged files are not again.
  Write(files.cert, second.cert);
  Write(files.key, second.key);
  Write(files.client_ca, second.cert);
  ASSERT_TRUE((*mirror)->Refresh().ok());
  EXPECT_EQ((*mirror)->published(), 2);
  EXPECT_EQ(published((*mirror)->key_path()), second.key);
  EXPECT_EQ(published((*mirror)->ca_path()), second.cert);
  ASSERT_TRUE((*mirror)->Refresh().ok());
  EXPECT_EQ((*mirror)->published(), 2);
  EXPECT_EQ(refused, 0);  // Refresh's callers count; the thread does (not started here)
  const std::string private_dir = (*mirror)->key_path();
  mirror->reset();  // removes its private directory
  EXPECT_FALSE(std::ifstream(private_dir).good());
}

}  // namespace
}  // namespace samplerd
