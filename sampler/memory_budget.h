// A byte budget shared by everything a request can make the server allocate (concatenated
// shards, ...). Memory is reserved before it is allocated;
// a reservation that does not fit fails at once with RESOURCE_EXHAUSTED, so no request can
// exhaust the server, and concurrent requests share one bound.
//
//   MemoryBudget budget(1 << 30);
//   ASSIGN_OR_RETURN(MemoryBudget::Lease lease, budget.Reserve(bytes, "logits.shards"));
//   std::vector<unsigned char> storage(bytes);  // released with `lease`
#ifndef SAMPLERD_SAMPLER_MEMORY_BUDGET_H_
#define SAMPLERD_SAMPLER_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace samplerd {

class MemoryBudget {
 public:
  // `capacity` bytes; <= 0 admits nothing.
  explicit MemoryBudget(int64_t capacity) : capacity_(capacity) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Holds reserved bytes until destroyed. Must not outlive the budget.
  using Lease = std::shared_ptr<const void>;

  // Reserves `bytes`; RESOURCE_EXHAUSTED naming `field` when they do not fit beside what is
  // reserved now, INVALID_ARGUMENT for a negative size.
  absl::StatusOr<Lease> Reserve(int64_t bytes, const std::string& field);

  int64_t capacity() const { return capacity_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const int64_t capacity_;
  std::atomic<int64_t> used_{0};
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_MEMORY_BUDGET_H_
