#include "sampler/draft_pool.h"

#include "absl/strings/str_cat.h"

namespace samplerd {

std::string DraftPoolKey(const std::string& scope, const std::string& request_id) {
  // The scope's length first: no (scope, id) pair can spell another's key.
  return absl::StrCat(scope.size(), ":", scope, request_id);
}

int64_t DraftRow::Bytes() const {
  const int64_t values =
      device ? device->reserved * static_cast<int64_t>(sizeof(float))
             : static_cast<int64_t>(logprobs.capacity() * sizeof(float) +
                                    token_ids.capacity() * sizeof(int32_t));
  return values + kRowOverheadBytes;
}

int DraftPool::ExpireLocked(absl::Time now) {
  int dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.expires <= now) {
      used_ -= it->second.bytes;
      entries_.erase(it++);
      ++dropped;
    } else {
      ++it;
    }
  }
  // A full scan at most every ttl / 8: an entry outlives its ttl by at most that much.
  next_sweep_ = now + options_.ttl / 8;
  return dropped;
}

int DraftPool::Expire() {
  absl::MutexLock lock(&mu_);
  return ExpireLocked(Now());
}

absl::Status DraftPool::Store(const std::string& key,
                              std::vector<std::pair<int32_t, DraftRow>> rows) {
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  if (now >= next_sweep_) ExpireLocked(now);
  auto it = entries_.find(key);
  int64_t delta = 0;
  if (it == entries_.end()) delta += kEntryOverheadBytes + static_cast<int64_t>(key.size());
  for (const auto& [index, row] : rows) {
    delta += row.Bytes();
    if (it != entries_.end()) {
      if (auto old = it->second.rows.find(index); old != it->second.rows.end()) {
        delta -= old->second.Bytes();
      }
    }
  }
  if (delta > options_.capacity_bytes - used_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "draft pool full: the drafts of request need ", delta, " more bytes, ",
        options_.capacity_bytes - used_, " of ", options_.capacity_bytes,
        " are free (--draft_pool_bytes)"));
  }
  used_ += delta;
  Stored& entry = entries_[key];
  entry.bytes += delta;
  entry.expires = now + options_.ttl;
  for (auto& [index, row] : rows) entry.rows[index] = std::move(row);
  return absl::OkStatus();
}

absl::StatusOr<DraftPool::Entry> DraftPool::Take(const std::string& key) {
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.expires <= now) {
    if (it != entries_.end()) {
      used_ -= it->second.bytes;
      entries_.erase(it);
    }
    return absl::FailedPreconditionError(
        "the draft pool holds no drafts of this request (never stored by this client, already "
        "verified, released, or expired): send draft_logprobs or draft_topn, or run its DRAFT "
        "step first");
  }
  Entry entry = std::move(it->second.rows);
  used_ -= it->second.bytes;
  entries_.erase(it);
  return entry;
}

int DraftPool::Release(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return 0;
  const int rows = static_cast<int>(it->second.rows.size());
  used_ -= it->second.bytes;
  entries_.erase(it);
  return rows;
}

int64_t DraftPool::UsedBytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

int DraftPool::Entries() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace samplerd
