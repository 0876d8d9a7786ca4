// Who is on the other end of a call, as far as the transport can tell (issue 45). A client id
// is what a client says it is; a uid is what the kernel says, and it is what decides whose
// registrations a call may use and which shared memory a client may hand samplerd:
//   - the unix socket: SO_PEERCRED of the connection (samplerd accepts it itself; LocalListener);
//   - plaintext TCP from this host: the uid owning the client's socket, asked of the kernel by
//     sock_diag at accept (the same netlink query `ss -e` makes);
//   - TLS: the client certificate (AccessPolicy); a uid only where RegisterBuffer or
//     OpenStepChannel needs one, looked up on demand (PeerUidByAddress).
// A connection samplerd accepted itself reaches gRPC as a descriptor, so its calls' peer string
// is "fd:N"; PeerDirectory maps it back to what was learnt at accept.
//
//   PeerDirectory peers;
//   peers.Record(fd, PeerDirectory::Peer{uid, "127.0.0.1:53312"});   // at accept
//   PeerDirectory::Peer who = peers.Find(context.peer());            // in a handler
#ifndef SAMPLERD_SERVER_PEER_IDENTITY_H_
#define SAMPLERD_SERVER_PEER_IDENTITY_H_

#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace samplerd {

class PeerDirectory {
 public:
  struct Peer {
    std::optional<uint32_t> uid;  // unknown: a host the kernel cannot see into, or not looked up
    std::string address;          // for logs and connection scopes: "127.0.0.1:53312", "unix"
    uint64_t connection = 0;      // a serial per accepted connection (0: not accepted by us)
  };

  // Connection `fd` (handed to gRPC, whose calls on it see the peer "fd:<fd>") is `peer`.
  // Overwrites what an earlier connection of the same descriptor number left.
  void Record(int fd, Peer peer);
  // What Record said of the connection behind gRPC peer string `grpc_peer`; for any other
  // peer (gRPC's own listeners) only its address.
  Peer Find(absl::string_view grpc_peer) const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Peer> by_fd_ ABSL_GUARDED_BY(mu_);
  uint64_t next_connection_ ABSL_GUARDED_BY(mu_) = 0;
};

// The uid owning the TCP socket whose local address is `local` and whose remote address is
// `remote` (both AF_INET or AF_INET6), from the kernel's socket table of this network
// namespace; nullopt when there is none (the peer is on another host) or the query fails.
std::optional<uint32_t> TcpSocketUid(const sockaddr_storage& local, const sockaddr_storage& remote);

// For a call through gRPC's own TCP listener (TLS): the uid of the client socket named by
// gRPC's peer string ("ipv4:127.0.0.1:53312", "ipv6:[::1]:53312"), connected to `server_port`
// on any of this host's addresses. nullopt for another host, a unix socket or a parse failure.
std::optional<uint32_t> PeerUidByAddress(absl::string_view grpc_peer, int server_port);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_PEER_IDENTITY_H_
