// A POSIX shared-memory object mapped read-only: the HOST_SHM regions steps read logits from.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmRegion> region, ShmRegion::Open("/worker0-logits", size));
//   const void* bytes = region->data();  // region->byte_size() bytes, valid until destroyed
#ifndef SAMPLERD_SERVER_SHM_REGION_H_
#define SAMPLERD_SERVER_SHM_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace samplerd {

class ShmRegion final {
 public:
  // Maps the first `byte_size` bytes of shm object `shm_name` ("/name") read-only.
  // Errors: INVALID_ARGUMENT for a bad name or size; NOT_FOUND when the object does not exist;
  // FAILED_PRECONDITION when it is smaller than byte_size or cannot be mapped.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Open(const std::string& shm_name,
                                                         int64_t byte_size);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  const void* data() const { return data_; }
  int64_t byte_size() const { return byte_size_; }

 private:
  ShmRegion(const void* data, int64_t byte_size) : data_(data), byte_size_(byte_size) {}
  const void* data_;
  int64_t byte_size_;
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SHM_REGION_H_
