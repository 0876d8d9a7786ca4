#include "sampler/range_allocator.h"

#include <cstdlib>
#include <iterator>

namespace samplerd {

RangeAllocator::RangeAllocator(int64_t capacity, int64_t alignment)
    : capacity_(capacity / alignment * alignment), alignment_(alignment) {
  if (capacity_ > 0) free_[0] = capacity_;
}

int64_t RangeAllocator::Reserved(int64_t size) const {
  return (size + alignment_ - 1) / alignment_ * alignment_;
}

std::optional<int64_t> RangeAllocator::Allocate(int64_t size) {
  if (size <= 0) return std::nullopt;
  const int64_t need = Reserved(size);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const int64_t offset = it->first;
    const int64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[offset + need] = rest;
    used_ranges_[offset] = need;
    used_ += need;
    return offset;
  }
  return std::nullopt;
}

void RangeAllocator::Free(int64_t offset) {
  auto used = used_ranges_.find(offset);
  if (used == used_ranges_.end()) std::abort();  // not an allocated range: a caller bug
  int64_t begin = offset, size = used->second;
  used_ -= size;
  used_ranges_.erase(used);
  // Merge with the free neighbours so that free ranges stay maximal.
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == begin + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[begin] = size;
}

int64_t RangeAllocator::largest_free() const {
  int64_t best = 0;
  for (const auto& [offset, size] : free_) best = size > best ? size : best;
  return best;
}

}  // namespace samplerd
