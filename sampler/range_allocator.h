// First-fit allocation of ranges of [0, capacity) with coalescing frees: the bookkeeping of a
// slab of memory the caller owns (the CUDA backend's device-resident draft pool). Offsets and
// sizes are in the caller's units; sizes are rounded up to `alignment` units so that every
// offset stays aligned. Not thread-safe: the owner locks.
//
//   RangeAllocator ranges(/*capacity=*/1 << 20, /*alignment=*/32);
//   std::optional<int64_t> at = ranges.Allocate(129280);  // nullopt: no free range that big
//   ranges.Free(*at);
#ifndef SAMPLERD_SAMPLER_RANGE_ALLOCATOR_H_
#define SAMPLERD_SAMPLER_RANGE_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>

namespace samplerd {

class RangeAllocator {
 public:
  RangeAllocator(int64_t capacity, int64_t alignment);

  // The size a request of `size` units occupies (rounded up to the alignment).
  int64_t Reserved(int64_t size) const;
  // The lowest free offset with Reserved(size) units free after it; nullopt when there is none
  // (full, or too fragmented). size > 0.
  std::optional<int64_t> Allocate(int64_t size);
  // Returns the range that Allocate gave at `offset` to the free list. Unknown offsets are a
  // programming error (aborts).
  void Free(int64_t offset);

  int64_t capacity() const { return capacity_; }
  int64_t used() const { return used_; }
  int64_t largest_free() const;

 private:
  const int64_t capacity_, alignment_;
  std::map<int64_t, int64_t> free_;  // offset -> size, disjoint and never adjacent
  std::map<int64_t, int64_t> used_ranges_;
  int64_t used_ = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_RANGE_ALLOCATOR_H_
