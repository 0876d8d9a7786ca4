#include "server/local_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/server_posix.h"

namespace samplerd {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::string AddressText(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(v4.sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(v6.sin6_port));
  }
  return "unix";
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalListener>> LocalListener::Bind(const std::string& address,
                                                                   mode_t unix_mode) {
  absl::string_view rest = address;
  if (absl::ConsumePrefix(&rest, "unix:")) {
    const std::string path(rest);
    sockaddr_un sun{};
    sun.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof(sun.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("--unix_socket: '", path,
                                                     "' is empty or too long for a socket path"));
    }
    std::memcpy(sun.sun_path, path.data(), path.size());
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Errno("socket");
    struct stat old{};
    if (lstat(path.c_str(), &old) == 0 && S_ISSOCK(old.st_mode)) unlink(path.c_str());
    // Created owner-only (no window in which others may connect), then given its mode.
    const mode_t old_umask = umask(0077);
    const int bound = bind(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun));
    umask(old_umask);
    if (bound != 0 || listen(fd, SOMAXCONN) != 0) {
      absl::Status status = Errno(absl::StrCat("--unix_socket: cannot listen on ", path));
      close(fd);
      return status;
    }
    if (chmod(path.c_str(), unix_mode) != 0) {
      absl::Status status = Errno(absl::StrCat("--unix_socket_mode: chmod ", path));
      close(fd);
      unlink(path.c_str());
      return status;
    }
    return std::unique_ptr<LocalListener>(new LocalListener(fd, 0, path));
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  const std::string service = address.substr(colon + 1);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") host = "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: '", address, "' is not a numeric address and port"));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return Errno("socket");
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (found->ai_family == AF_INET6) {
    const int zero = 0;  // [::] takes IPv4 clients too, as gRPC's listener does
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  const int bound = bind(fd, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  if (bound != 0 || listen(fd, SOMAXCONN) != 0) {
    absl::Status status = Errno(absl::StrCat("--listen: cannot listen on ", address));
    close(fd);
    return status;
  }
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
  const int port = local.ss_family == AF_INET
                       ? ntohs(reinterpret_cast<sockaddr_in&>(local).sin_port)
                       : ntohs(reinterpret_cast<sockaddr_in6&>(local).sin6_port);
  return std::unique_ptr<LocalListener>(new LocalListener(fd, port, ""));
}

LocalListener::LocalListener(int fd, int port, std::string unix_path)
    : fd_(fd), port_(port), unix_path_(std::move(unix_path)) {
  if (pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;  // then Stop waits a poll
}

void LocalListener::Stop() {
  stop_.store(true);
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

LocalListener::~LocalListener() {
  Stop();
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
  if (!unix_path_.empty()) unlink(unix_path_.c_str());
}

void LocalListener::Start(grpc::Server* server, PeerDirectory* peers, ConnectionLedger* ledger) {
  thread_ = std::thread([this, server, peers, ledger] { AcceptLoop(server, peers, ledger); });
}

void LocalListener::AcceptLoop(grpc::Server* server, PeerDirectory* peers, ConnectionLedger* ledger) {
  // Refusals are logged at most once a second (a client retrying in a loop would flood it).
  absl::Time last_warning = absl::InfinitePast();
  int unlogged = 0;
  while (!stop_.load()) {
    pollfd ready[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(ready, wake_[0] >= 0 ? 2 : 1, 100) < 0) continue;
    if (ready[1].revents != 0) return;  // Stop
    if (ready[0].revents == 0) continue;
    sockaddr_storage remote{};
    socklen_t length = sizeof(remote);
    const int connection = accept4(fd_, reinterpret_cast<sockaddr*>(&remote), &length,
                                   SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (connection < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        spdlog::warn("accept: {} (descriptors exhausted); retrying", std::strerror(errno));
        poll(nullptr, 0, 50);
      }
      continue;
    }
    PeerDirectory::Peer peer;
    if (unix_path_.empty()) {
      const int one = 1;  // as gRPC's own listener does: no Nagle delay on small responses
      setsockopt(connection, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      sockaddr_storage local{};
      socklen_t local_length = sizeof(local);
      getsockname(connection, reinterpret_cast<sockaddr*>(&local), &local_length);
      // The client's socket is local = our remote, remote = our local.
      peer.uid = TcpSocketUid(remote, local);
      peer.address = AddressText(remote);
    } else {
      ucred credentials{};
      socklen_t credentials_length = sizeof(credentials);
      if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &credentials, &credentials_length) ==
          0) {
        peer.uid = credentials.uid;
      }
      peer.address = absl::StrCat("unix(pid ", credentials.pid, ")");
    }
    if (ledger != nullptr) {
      if (absl::Status admitted = ledger->Admit(connection, peer.uid); !admitted.ok()) {
        close(connection);
        ++unlogged;
        if (absl::Now() - last_warning >= absl::Seconds(1)) {
          spdlog::warn("connection from {} refused: {} ({} refused since the last warning)",
                       peer.address, std::string(admitted.message()), unlogged);
          last_warning = absl::Now();
          unlogged = 0;
        }
        continue;
      }
    }
    // Recorded before gRPC sees the connection: its first call finds it.
    peers->Record(connection, peer);
    grpc::AddInsecureChannelFromFd(server, connection);
  }
}

}  // namespace samplerd
