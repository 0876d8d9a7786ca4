// Which clients are still there, for the registrations they own (issue 26). A client (its
// `samplerd-client-id`, else its peer address) is alive while a stream of it is open, and for
// `lease` after its last call. It is gone at once when a stream of it ends because the client
// went away (the connection dropped: a killed worker) and no other stream of it is open, or
// when its lease runs out. The service releases a gone owner's registrations: their memory is
// unmapped once the last step reading it finishes.
//
//   OwnerLeases leases(absl::Seconds(5));
//   leases.Touch(owner, absl::Now());                       // every call of the client
//   for (const std::string& gone : leases.TakeExpired(absl::Now())) registry.ReleaseOwner(gone);
//
// Thread-safe. Owners are tracked only once they own something (Track), so clients that never
// register cost nothing.
#ifndef SAMPLERD_SERVER_OWNER_LEASES_H_
#define SAMPLERD_SERVER_OWNER_LEASES_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace samplerd {

class OwnerLeases {
 public:
  // `lease` <= 0: owners never expire (only a dropped stream ends them).
  explicit OwnerLeases(absl::Duration lease) : lease_(lease) {}

  absl::Duration lease() const { return lease_; }

  // `owner` now owns something: from here on its lease counts.
  void Track(const std::string& owner, absl::Time now);
  // A call of `owner` (any rpc): renews its lease if it is tracked.
  void Touch(const std::string& owner, absl::Time now);
  // A stream of `owner` opened / ended. `dropped`: it ended because the client went away (the
  // call was cancelled), not by the client closing it. Returns true when that made the owner
  // gone (a dropped stream and no other stream of it open): the caller releases it now.
  void StreamOpened(const std::string& owner, absl::Time now);
  bool StreamEnded(const std::string& owner, bool dropped, absl::Time now);
  // Tracked owners with no open stream whose lease ran out by `now`: removed and returned.
  std::vector<std::string> TakeExpired(absl::Time now);
  // Whether `owner` is tracked and alive at `now` (an open stream, or a call within the lease).
  bool Alive(const std::string& owner, absl::Time now) const;
  // How long until `owner`'s lease runs out at `now` if it makes no call: nullopt while it has
  // an open stream or is not tracked (or leases never expire). What a registration refused
  // ALREADY_EXISTS for a name of `owner` may wait before trying again (a dead owner's name).
  std::optional<absl::Duration> LeaseLeft(const std::string& owner, absl::Time now) const;
  // Owners tracked now (they own registrations or step channels): bounded by what they own.
  int Tracked() const;
  // Stops tracking `owner` (released, or it owns nothing any more).
  void Forget(const std::string& owner);

 private:
  struct Entry {
    bool tracked = false;
    int open_streams = 0;
    absl::Time last_call;
  };
  bool Expired(const Entry& e, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration lease_;
  mutable absl::Mutex mu_;
  // Owners with an open stream or tracked (entries of neither are dropped).
  absl::flat_hash_map<std::string, Entry> owners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_OWNER_LEASES_H_
