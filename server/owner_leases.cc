#include "server/owner_leases.h"

#include <algorithm>

namespace samplerd {

bool OwnerLeases::Expired(const Entry& e, absl::Time now) const {
  return e.open_streams == 0 && lease_ > absl::ZeroDuration() && now - e.last_call > lease_;
}

void OwnerLeases::Track(const std::string& owner, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = owners_[owner];
  e.tracked = true;
  e.last_call = now;
}

void OwnerLeases::Touch(const std::string& owner, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it != owners_.end()) it->second.last_call = now;
}

void OwnerLeases::StreamOpened(const std::string& owner, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = owners_[owner];
  ++e.open_streams;
  e.last_call = now;
}

bool OwnerLeases::StreamEnded(const std::string& owner, bool dropped, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) return false;
  Entry& e = it->second;
  if (e.open_streams > 0) --e.open_streams;
  e.last_call = now;
  if (e.open_streams > 0) return false;
  if (!e.tracked) {
    owners_.erase(it);  // owns nothing: nothing to release
    return false;
  }
  if (!dropped) return false;
  owners_.erase(it);
  return true;
}

std::vector<std::string> OwnerLeases::TakeExpired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> gone;
  for (auto it = owners_.begin(); it != owners_.end();) {
    if (it->second.tracked && Expired(it->second, now)) {
      gone.push_back(it->first);
      owners_.erase(it++);
    } else {
      ++it;
    }
  }
  return gone;
}

bool OwnerLeases::Alive(const std::string& owner, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  return it != owners_.end() && it->second.tracked && !Expired(it->second, now);
}

std::optional<absl::Duration> OwnerLeases::LeaseLeft(const std::string& owner,
                                                     absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end() || !it->second.tracked || it->second.open_streams > 0 ||
      lease_ <= absl::ZeroDuration()) {
    return std::nullopt;
  }
  return std::max(absl::ZeroDuration(), lease_ - (now - it->second.last_call));
}

int OwnerLeases::Tracked() const {
  absl::MutexLock lock(&mu_);
  int tracked = 0;
  for (const auto& [owner, entry] : owners_) tracked += entry.tracked;
  return tracked;
}

void OwnerLeases::Forget(const std::string& owner) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(owner);
  if (it == owners_.end()) return;
  if (it->second.open_streams > 0) {
    it->second.tracked = false;
  } else {
    owners_.erase(it);
  }
}

}  // namespace samplerd
