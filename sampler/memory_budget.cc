#include "sampler/memory_budget.h"

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::StatusOr<MemoryBudget::Lease> MemoryBudget::Reserve(int64_t bytes, const std::string& field) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": negative size ", bytes));
  }
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    // used <= capacity_ always holds, so capacity_ - used cannot overflow.
    if (bytes > capacity_ - used) {
      return absl::ResourceExhaustedError(absl::StrCat(
          field, ": needs ", bytes, " bytes of server memory; ", capacity_ - used, " of ",
          capacity_, " are free (--max_request_memory_bytes)"));
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  // The lease's deleter gives the bytes back; it points at the budget only for identity.
  return Lease(this, [this, bytes](const void*) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
  });
}

}  // namespace samplerd
