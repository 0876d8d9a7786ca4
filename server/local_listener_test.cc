// LocalListener::Stop closes the listening socket: a drain must refuse new connections at once.
// Before, the socket stayed open until the listener's destructor, so a client reconnecting
// during the drain sat in the kernel's backlog, never accepted, until its connect timeout
// (samplerd_restart_test's rollout phase hung once gRPC's 20 s connect timeout applied).
#include "server/local_listener.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>  // mkdtemp
#include <cstring>
#include <string>

namespace samplerd {
namespace {

// 0 when a TCP connection to 127.0.0.1:port was established, else errno.
int ConnectTcp(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  const int error = rc == 0 ? 0 : errno;
  close(fd);
  return error;
}

int ConnectUnix(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  const int error = rc == 0 ? 0 : errno;
  close(fd);
  return error;
}

TEST(LocalListener, StopRefusesNewTcpConnectionsAtOnce) {
  auto listener = LocalListener::Bind("127.0.0.1:0", 0600);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = (*listener)->port();
  ASSERT_GT(port, 0);
  // Bound and listening, not yet accepting: the kernel queues the connection.
  EXPECT_EQ(ConnectTcp(port), 0);
  (*listener)->Stop();
  EXPECT_EQ(ConnectTcp(port), ECONNREFUSED);
  (*listener)->Stop();  // idempotent
  listener->reset();
}

TEST(LocalListener, StopRefusesNewUnixConnectionsAtOnce) {
  // Under /tmp: TEST_TMPDIR's path is longer than a socket address holds (108 bytes).
  char dir[] = "/tmp/samplerd-listener-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/listener.sock";
  auto listener = LocalListener::Bind("unix:" + path, 0600);
  ASSERT_TRUE(listener.ok()) << listener.status();
  EXPECT_EQ(ConnectUnix(path), 0);
  (*listener)->Stop();
  EXPECT_EQ(ConnectUnix(path), ECONNREFUSED);
  listener->reset();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the socket file outlived its listener";
  rmdir(dir);
}

}  // namespace
}  // namespace samplerd
