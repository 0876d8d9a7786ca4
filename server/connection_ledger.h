// Bounds the connections samplerd's own listeners (server/local_listener.h) hold at once: over
// all clients and per local user. Nothing closes a connection whose client never sends a
// byte, and each holds a descriptor and ~13 KB of gRPC's transport: 15,000 idle TCP
// connections from one unprivileged process added 191 MiB to samplerd's RSS, and at the
// process's descriptor limit (2,048 in that test: 2,036 idle connections) samplerd accepted no
// one else at all. A connection over a limit is closed at accept.
//
// gRPC owns a connection once it is handed over and says nothing when it closes it, so the
// ledger finds that out itself: it keeps each admitted connection's descriptor with the socket
// it named (device and inode), and before it refuses anyone it sweeps: an entry whose
// descriptor is closed, or now names another file, is a connection gone. Its counts are
// therefore exact whenever they refuse; between sweeps they may count connections since
// closed (Sweep, run periodically, keeps the gauge current).
//
//   ConnectionLedger ledger({.max_total = 1024, .max_per_uid = 256});
//   if (absl::Status s = ledger.Admit(fd, uid); !s.ok()) close(fd);   // at accept
#ifndef SAMPLERD_SERVER_CONNECTION_LEDGER_H_
#define SAMPLERD_SERVER_CONNECTION_LEDGER_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace samplerd {

class ConnectionLedger {
 public:
  struct Limits {
    int max_total = 1024;   // --max_connections
    int max_per_uid = 256;  // --max_connections_per_uid (connections of an unknown uid: one user)
  };
  explicit ConnectionLedger(Limits limits) : limits_(limits) {}

  // Whether the just-accepted connection `fd` of `uid` (nullopt: unknown) may be served. OK:
  // it is counted until its descriptor closes. RESOURCE_EXHAUSTED, naming the flag: the caller
  // closes it. INTERNAL: `fd` is not an open descriptor.
  absl::Status Admit(int fd, std::optional<uint32_t> uid);
  // Forgets the connections whose descriptors have closed; returns how many remain.
  int Sweep();
  // Connections refused so far.
  int64_t refused() const;

 private:
  struct Entry {
    dev_t dev;
    ino_t ino;
    int64_t uid_key;  // the uid, or -1 for unknown
  };
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> by_fd_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, int> per_uid_ ABSL_GUARDED_BY(mu_);
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CONNECTION_LEDGER_H_
