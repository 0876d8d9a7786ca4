// The service's step channels (server/step_channel.h) by id, with their owners and the limits
// on them (issue 48: out of the service, with its own tests). A channel is opened in three
// moves so that the limits hold under concurrent opens (issue 45: 160 concurrent opens got 65
// channels of 64) without holding the lock while StepChannel::Open maps the object:
//
//   RETURN_IF_ERROR(table.Reserve(owner));           // counts against both limits, or refuses
//   auto channel = StepChannel::Open(...);           // unlocked
//   if (!channel.ok()) { table.Cancel(owner); return channel.status(); }
//   const std::string id = table.Add(owner, *std::move(channel));
//
// Channels are closed with their owner (DropOwner) or once their worker closed them
// (DropClosed); their threads are joined outside the lock.
#ifndef SAMPLERD_SERVER_CHANNEL_TABLE_H_
#define SAMPLERD_SERVER_CHANNEL_TABLE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/step_channel.h"

namespace samplerd {

class ChannelTable {
 public:
  ChannelTable(int max_channels, int max_per_owner)
      : max_channels_(max_channels), max_per_owner_(max_per_owner) {}
  ~ChannelTable() { Clear(); }
  ChannelTable(const ChannelTable&) = delete;
  ChannelTable& operator=(const ChannelTable&) = delete;

  // Takes a slot for `owner`: RESOURCE_EXHAUSTED naming the limit when all `max_channels` or
  // the owner's `max_per_owner` are open or being opened.
  absl::Status Reserve(const std::string& owner);
  // Gives back a Reserve that did not become a channel.
  void Cancel(const std::string& owner);
  // Turns `owner`'s reservation into `channel`; returns its id ("channel-N").
  std::string Add(const std::string& owner, std::unique_ptr<StepChannel> channel);

  // Closes every channel of `owner`; returns how many.
  int DropOwner(const std::string& owner);
  // Closes the channels whose workers closed them; returns how many.
  int DropClosed();
  // Closes them all (before what their threads call into goes away).
  void Clear();

  int Owned(const std::string& owner) const;
  int Size() const;

 private:
  struct Entry {
    std::string owner;
    std::unique_ptr<StepChannel> channel;
  };
  template <typename Pred>
  int Drop(Pred drop);

  const int max_channels_;
  const int max_per_owner_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> channels_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Reservations not yet added, in all and by owner.
  absl::flat_hash_map<std::string, int> opening_ ABSL_GUARDED_BY(mu_);
  int opening_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_CHANNEL_TABLE_H_
