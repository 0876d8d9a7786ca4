#include "server/tls_listener.h"

#include <cstdio>
#include <fstream>
#include <string>

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

TEST(ListenerCredentials, NamesTheFlagAtFault) {
  const std::string dir = ::testing::TempDir();
  const std::string pem = dir + "/cert.pem", junk = dir + "/junk.pem";
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  std::ofstream(junk) << "not a certificate\n";
  auto message = [](std::string cert, std::string key, std::string client_ca,
                    int reload_interval_s = 60) {
    TlsFiles tls;
    tls.cert = cert;
    tls.key = key;
    tls.client_ca = client_ca;
    tls.reload_interval_s = reload_interval_s;
    return std::string(ListenerCredentials(tls, "0.0.0.0:1", false).status().message());
  };
  EXPECT_THAT(message(pem, "", ""), HasSubstr("--tls_key_file"));
  EXPECT_THAT(message("", pem, ""), HasSubstr("--tls_cert_file"));
  EXPECT_THAT(message("", "", pem), HasSubstr("--tls_client_ca_file"));
  EXPECT_THAT(message(dir + "/missing.pem", pem, ""), HasSubstr("--tls_cert_file: cannot read"));
  EXPECT_THAT(message(pem, junk, ""), HasSubstr("--tls_key_file: "));
  EXPECT_THAT(message(pem, pem, junk), HasSubstr("--tls_client_ca_file: "));
  EXPECT_THAT(message(pem, pem, "", 0), HasSubstr("--tls_reload_interval_s"));
}

}  // namespace
}  // namespace samplerd
