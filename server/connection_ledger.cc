#include "server/connection_ledger.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::Status ConnectionLedger::Admit(int fd, std::optional<uint32_t> uid) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("connection descriptor ", fd, ": ", std::strerror(errno)));
  }
  const int64_t key = uid.has_value() ? static_cast<int64_t>(*uid) : -1;
  absl::MutexLock lock(&mu_);
  // The descriptor number of a connection gRPC has closed is reused: its entry is stale.
  DropLocked(fd);
  auto held = [&] {
    auto it = per_uid_.find(key);
    return it == per_uid_.end() ? 0 : it->second;
  };
  if (static_cast<int>(by_fd_.size()) >= limits_.max_total || held() >= limits_.max_per_uid) {
    SweepLocked();  // the counts exact before anyone is refused
  }
  if (static_cast<int>(by_fd_.size()) >= limits_.max_total) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        by_fd_.size(), " connections are open, the server's limit (--max_connections)"));
  }
  if (held() >= limits_.max_per_uid) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        uid.has_value() ? absl::StrCat("uid ", *uid) : std::string("clients of unknown uid"),
        " hold ", held(), " connections, the limit (--max_connections_per_uid)"));
  }
  by_fd_[fd] = Entry{st.st_dev, st.st_ino, key};
  ++per_uid_[key];
  return absl::OkStatus();
}

int ConnectionLedger::Sweep() {
  absl::MutexLock lock(&mu_);
  SweepLocked();
  return static_cast<int>(by_fd_.size());
}

int64_t ConnectionLedger::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void ConnectionLedger::SweepLocked() {
  std::vector<int> gone;
  for (const auto& [fd, entry] : by_fd_) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_dev != entry.dev || st.st_ino != entry.ino) gone.push_back(fd);
  }
  for (int fd : gone) DropLocked(fd);
}

void ConnectionLedger::DropLocked(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  auto count = per_uid_.find(it->second.uid_key);
  if (count != per_uid_.end() && --count->second <= 0) per_uid_.erase(count);
  by_fd_.erase(it);
}

}  // namespace samplerd
