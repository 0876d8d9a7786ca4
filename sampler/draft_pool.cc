#include "sampler/draft_pool.h"

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::Status DraftPool::Store(const std::string& request_id,
                              std::vector<std::pair<int32_t, DraftRow>> rows) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request_id);
  int64_t delta = 0;
  for (const auto& [index, row] : rows) {
    delta += row.Elements();
    if (it != entries_.end()) {
      if (auto old = it->second.find(index); old != it->second.end()) {
        delta -= old->second.Elements();
      }
    }
  }
  if (used_ + delta > options_.capacity_elements) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "draft pool full: the drafts of request '", request_id, "' need ", delta,
        " more elements, ", options_.capacity_elements - used_, " of ",
        options_.capacity_elements, " are free"));
  }
  used_ += delta;
  Entry& entry = entries_[request_id];
  for (auto& [index, row] : rows) entry[index] = std::move(row);
  return absl::OkStatus();
}

absl::StatusOr<DraftPool::Entry> DraftPool::Take(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the draft pool holds no drafts of request '", request_id,
                     "': send draft_logprobs or draft_topn, or run its DRAFT step first"));
  }
  Entry entry = std::move(it->second);
  entries_.erase(it);
  for (const auto& [index, row] : entry) used_ -= row.Elements();
  return entry;
}

int DraftPool::Release(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end()) return 0;
  const int rows = static_cast<int>(it->second.size());
  for (const auto& [index, row] : it->second) used_ -= row.Elements();
  entries_.erase(it);
  return rows;
}

int64_t DraftPool::UsedElements() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace samplerd
