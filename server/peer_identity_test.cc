#include "server/peer_identity.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

sockaddr_storage Loopback(int port) {
  sockaddr_storage a{};
  auto& v4 = reinterpret_cast<sockaddr_in&>(a);
  v4.sin_family = AF_INET;
  v4.sin_port = htons(static_cast<uint16_t>(port));
  v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A loopback listener on a free port.
struct Listener {
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_storage a = Loopback(0);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(sockaddr_in)), 0);
    EXPECT_EQ(listen(fd, 8), 0);
    socklen_t length = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
    port = ntohs(reinterpret_cast<sockaddr_in&>(a).sin_port);
  }
  ~Listener() { close(fd); }
  int fd;
  int port;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_storage a = Loopback(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(sockaddr_in)), 0);
  return fd;
}

sockaddr_storage LocalOf(int fd) {
  sockaddr_storage a{};
  socklen_t length = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
  return a;
}

TEST(PeerIdentity, TcpSocketUidNamesTheOwnerOfTheClientSocket) {
  Listener server;
  const int client = Connect(server.port);
  const int accepted = accept(server.fd, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  const sockaddr_storage client_local = LocalOf(client);
  auto uid = TcpSocketUid(client_local, Loopback(server.port));
  ASSERT_TRUE(uid.has_value());
  EXPECT_EQ(*uid, geteuid());
  // The same from gRPC's peer string, trying this host's addresses.
  const int client_port = ntohs(reinterpret_cast<const sockaddr_in&>(client_local).sin_port);
  uid = PeerUidByAddress(absl::StrCat("ipv4:127.0.0.1:", client_port), server.port);
  ASSERT_TRUE(uid.has_value());
  EXPECT_EQ(*uid, geteuid());
  // A four-tuple no socket has: unknown, not a guess.
  EXPECT_FALSE(TcpSocketUid(Loopback(1), Loopback(server.port)).has_value());
  EXPECT_FALSE(PeerUidByAddress("unix:/tmp/x", server.port).has_value());
  EXPECT_FALSE(PeerUidByAddress("ipv4:nonsense", server.port).has_value());
  close(accepted);
  close(client);
}

// The uid is the kernel's, not the caller's say: a socket made by a process of another uid is
// reported as that uid.
TEST(PeerIdentity, TcpSocketUidOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  Listener server;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int fd = Connect(server.port);
    const sockaddr_storage local = LocalOf(fd);
    const uint16_t port = ntohs(reinterpret_cast<const sockaddr_in&>(local).sin_port);
    (void)!write(ready[1], &port, sizeof(port));
    pause();  // keeps the socket until killed
    _exit(0);
  }
  close(ready[1]);
  uint16_t client_port = 0;
  ASSERT_EQ(read(ready[0], &client_port, sizeof(client_port)),
            static_cast<ssize_t>(sizeof(client_port)));
  auto uid = TcpSocketUid(Loopback(client_port), Loopback(server.port));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  ASSERT_TRUE(uid.has_value());
  EXPECT_EQ(*uid, 65534u);
}

TEST(PeerIdentity, DirectoryFindsConnectionsByDescriptor) {
  PeerDirectory peers;
  peers.Record(7, PeerDirectory::Peer{1000u, "127.0.0.1:4000", 0});
  PeerDirectory::Peer found = peers.Find("fd:7");
  ASSERT_TRUE(found.uid.has_value());
  EXPECT_EQ(*found.uid, 1000u);
  EXPECT_EQ(found.address, "127.0.0.1:4000");
  const uint64_t first = found.connection;
  EXPECT_NE(first, 0u);
  // A later connection on the same descriptor replaces it, with a new serial.
  peers.Record(7, PeerDirectory::Peer{std::nullopt, "10.0.0.2:5000", 0});
  found = peers.Find("fd:7");
  EXPECT_FALSE(found.uid.has_value());
  EXPECT_NE(found.connection, first);
  // gRPC's own listeners' peers: their address only.
  found = peers.Find("ipv4:127.0.0.1:9");
  EXPECT_FALSE(found.uid.has_value());
  EXPECT_EQ(found.connection, 0u);
  EXPECT_EQ(found.address, "ipv4:127.0.0.1:9");
  EXPECT_EQ(peers.Find("fd:8").connection, 0u);
}

}  // namespace
}  // namespace samplerd
