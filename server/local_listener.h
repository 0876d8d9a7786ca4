// samplerd's plaintext listeners (loopback TCP, the unix socket), accepted by samplerd itself
// rather than by gRPC, so that each connection's peer is known before its first call: the unix
// socket's SO_PEERCRED, a TCP client's uid from the kernel's socket table (TcpSocketUid). The
// connection is then handed to gRPC (AddInsecureChannelFromFd: the same server, its quota and
// limits) and recorded in a PeerDirectory under its descriptor, which is how its calls'
// peer string ("fd:N") finds it. TLS listeners stay gRPC's own (their identity is the
// certificate).
//
//   ASSIGN_OR_RETURN(auto tcp, LocalListener::Bind("127.0.0.1:0", 0));
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();   // no ports of its own
//   tcp->Start(server.get(), &peers);                                 // accepts from now on
//   ...
//   tcp.reset();                                                      // before server->Shutdown
#ifndef SAMPLERD_SERVER_LOCAL_LISTENER_H_
#define SAMPLERD_SERVER_LOCAL_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "server/connection_ledger.h"
#include "server/peer_identity.h"

namespace samplerd {

class LocalListener {
 public:
  // Binds and listens on `address`: "host:port" (port 0 picks one; host a literal address or
  // localhost) or "unix:/path" (created with mode `unix_mode`, no window with a wider one; an
  // old socket file at the path is replaced). Nothing is accepted before Start.
  static absl::StatusOr<std::unique_ptr<LocalListener>> Bind(const std::string& address,
                                                              mode_t unix_mode);
  // Stops accepting, closes the listening socket (and removes the unix socket's file).
  // Connections already handed to gRPC stay the server's.
  ~LocalListener();
  LocalListener(const LocalListener&) = delete;
  LocalListener& operator=(const LocalListener&) = delete;

  int port() const { return port_; }  // 0 for the unix socket
  // Accepts on a thread of its own from now on; `server`, `peers` and `ledger` must outlive
  // it. A connection `ledger` refuses (a connection limit; null: no limits) is closed at once.
  void Start(grpc::Server* server, PeerDirectory* peers, ConnectionLedger* ledger = nullptr);
  // Stops accepting at once (the thread is woken, not polled), joins it and closes the
  // listening socket: a client that connects from now on is refused at once rather than
  // queued in the backlog of a server that will never answer it (during a drain, a queued
  // connection waited out the client's connect timeout, 20 s in gRPC). Idempotent.
  void Stop();

 private:
  LocalListener(int fd, int port, std::string unix_path);
  void AcceptLoop(grpc::Server* server, PeerDirectory* peers, ConnectionLedger* ledger);

  int fd_;  // -1 once Stop closed it
  const int port_;
  const std::string unix_path_;  // empty for TCP
  std::atomic<bool> stop_{false};
  int wake_[2] = {-1, -1};  // a pipe: Stop writes, the accept loop's poll wakes
  std::thread thread_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_LOCAL_LISTENER_H_
