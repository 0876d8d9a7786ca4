#include "server/peer_identity.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace samplerd {
namespace {

// Fills a sock_diag socket id's address words from `a` (network order, as the kernel keeps them).
void FillAddress(const sockaddr_storage& a, __be16* port, __be32 words[4]) {
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    *port = v4.sin_port;
    words[0] = v4.sin_addr.s_addr;
  } else {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    *port = v6.sin6_port;
    std::memcpy(words, &v6.sin6_addr, 16);
  }
}

// Parses gRPC's "ipv4:A.B.C.D:P" / "ipv6:[X::Y]:P" (brackets possibly percent-encoded).
std::optional<sockaddr_storage> ParseGrpcPeer(absl::string_view peer) {
  sockaddr_storage out{};
  int family = 0;
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    family = AF_INET;
  } else if (absl::ConsumePrefix(&peer, "ipv6:")) {
    family = AF_INET6;
  } else {
    return std::nullopt;
  }
  std::string text = absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}, {"%25", "%"}});
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  int port = 0;
  if (!absl::SimpleAtoi(text.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return std::nullopt;
  }
  absl::string_view host(text.data(), colon);
  absl::ConsumePrefix(&host, "[");
  absl::ConsumeSuffix(&host, "]");
  const std::string h(host.substr(0, host.find('%')));  // no zone index
  if (family == AF_INET) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(out);
    v4.sin_family = AF_INET;
    v4.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, h.c_str(), &v4.sin_addr) != 1) return std::nullopt;
  } else {
    auto& v6 = reinterpret_cast<sockaddr_in6&>(out);
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, h.c_str(), &v6.sin6_addr) != 1) return std::nullopt;
  }
  return out;
}

}  // namespace

void PeerDirectory::Record(int fd, Peer peer) {
  absl::MutexLock lock(&mu_);
  peer.connection = ++next_connection_;
  by_fd_[fd] = std::move(peer);
}

PeerDirectory::Peer PeerDirectory::Find(absl::string_view grpc_peer) const {
  absl::string_view rest = grpc_peer;
  int fd = -1;
  if (absl::ConsumePrefix(&rest, "fd:") && absl::SimpleAtoi(rest, &fd)) {
    absl::MutexLock lock(&mu_);
    auto it = by_fd_.find(fd);
    if (it != by_fd_.end()) return it->second;
  }
  Peer unknown;
  unknown.address = std::string(grpc_peer);
  return unknown;
}

std::optional<uint32_t> TcpSocketUid(const sockaddr_storage& local,
                                     const sockaddr_storage& remote) {
  const int family = local.ss_family;
  if ((family != AF_INET && family != AF_INET6) || remote.ss_family != family) {
    return std::nullopt;
  }
  const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return std::nullopt;
  // Never wait long on the kernel's answer: a handler's thread is waiting.
  const timeval timeout{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;  // one socket, found by its four-tuple
  message.request.sdiag_family = static_cast<uint8_t>(family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = ~0u;
  inet_diag_sockid& id = message.request.id;
  FillAddress(local, &id.idiag_sport, id.idiag_src);
  FillAddress(remote, &id.idiag_dport, id.idiag_dst);
  id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  std::optional<uint32_t> uid;
  if (sendto(fd, &message, sizeof(message), 0, reinterpret_cast<sockaddr*>(&kernel),
             sizeof(kernel)) == static_cast<ssize_t>(sizeof(message))) {
    alignas(nlmsghdr) char buffer[8192];
    const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got > 0) {
      int left = static_cast<int>(got);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(h, left);
           h = NLMSG_NEXT(h, left)) {
        if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
            h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
          const auto* found = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
          uid = found->idiag_uid;
          break;
        }
        if (h->nlmsg_type == NLMSG_ERROR || h->nlmsg_type == NLMSG_DONE) break;
      }
    }
  }
  close(fd);
  return uid;
}

std::optional<uint32_t> PeerUidByAddress(absl::string_view grpc_peer, int server_port) {
  const std::optional<sockaddr_storage> peer = ParseGrpcPeer(grpc_peer);
  if (!peer.has_value() || server_port <= 0 || server_port > 65535) return std::nullopt;
  // The client's socket: local = its address, remote = one of ours on server_port. Which of
  // this host's addresses it connected to is not in the peer string: try each.
  ifaddrs* addresses = nullptr;
  if (getifaddrs(&addresses) != 0) return std::nullopt;
  std::optional<uint32_t> uid;
  for (ifaddrs* a = addresses; a != nullptr && !uid.has_value(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != peer->ss_family) continue;
    sockaddr_storage ours{};
    if (peer->ss_family == AF_INET) {
      std::memcpy(&ours, a->ifa_addr, sizeof(sockaddr_in));
      reinterpret_cast<sockaddr_in&>(ours).sin_port = htons(static_cast<uint16_t>(server_port));
    } else {
      std::memcpy(&ours, a->ifa_addr, sizeof(sockaddr_in6));
      reinterpret_cast<sockaddr_in6&>(ours).sin6_port = htons(static_cast<uint16_t>(server_port));
    }
    uid = TcpSocketUid(*peer, ours);
  }
  freeifaddrs(addresses);
  return uid;
}

}  // namespace samplerd
