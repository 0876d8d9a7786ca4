#include "server/channel_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::Status ChannelTable::Reserve(const std::string& owner) {
  absl::MutexLock lock(&mu_);
  const int total = static_cast<int>(channels_.size()) + opening_total_;
  if (total >= max_channels_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(total, " step channels are open, the server's limit"));
  }
  int mine = opening_.contains(owner) ? opening_[owner] : 0;
  for (const auto& [id, entry] : channels_) mine += entry.owner == owner;
  if (mine >= max_per_owner_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this client has ", mine, " step channels open, the limit of one client "
                     "(--max_channels_per_client)"));
  }
  ++opening_[owner];
  ++opening_total_;
  return absl::OkStatus();
}

void ChannelTable::Cancel(const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (--opening_[owner] <= 0) opening_.erase(owner);
  --opening_total_;
}

std::string ChannelTable::Add(const std::string& owner, std::unique_ptr<StepChannel> channel) {
  absl::MutexLock lock(&mu_);
  if (--opening_[owner] <= 0) opening_.erase(owner);
  --opening_total_;
  std::string id = absl::StrCat("channel-", ++next_id_);
  channels_[id] = Entry{owner, std::move(channel)};
  return id;
}

template <typename Pred>
int ChannelTable::Drop(Pred drop) {
  std::vector<std::unique_ptr<StepChannel>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = channels_.begin(); it != channels_.end();) {
      if (drop(it->second)) {
        dropped.push_back(std::move(it->second.channel));
        channels_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return static_cast<int>(dropped.size());
}  // their threads are joined here, unlocked: a channel's step may be calling into the service

int ChannelTable::DropOwner(const std::string& owner) {
  return Drop([&](const Entry& e) { return e.owner == owner; });
}

int ChannelTable::DropClosed() {
  return Drop([](const Entry& e) { return !e.channel->serving(); });
}

void ChannelTable::Clear() {
  Drop([](const Entry&) { return true; });
}

int ChannelTable::Owned(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  int owned = 0;
  for (const auto& [id, entry] : channels_) owned += entry.owner == owner;
  return owned;
}

int ChannelTable::Size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(channels_.size());
}

}  // namespace samplerd
