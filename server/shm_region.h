// A POSIX shared-memory object that a worker registered as a HOST_SHM region, read through
// its descriptor.
//
// Why not mmap: the worker owns the object and may shrink it (ftruncate) at any time; a read
// of a mapped page past the new end raises SIGBUS and kills the server. pread() on the kept
// descriptor returns a short count instead, which fails only the step that read it. Opening
// never blocks (O_NONBLOCK: a FIFO would block open() forever) and never follows a link, and
// only regular files owned by an allowed uid are accepted, so a client cannot make the server
// read another user's memory even when the server runs as root.
//
//   ShmOpenOptions options;  // allowed owner: the server's own uid
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmRegion> region,
//                    ShmRegion::Open("/worker0-logits", size, options));
//   RETURN_IF_ERROR(region->Read(offset, bytes, destination, "logits.buffer"));
#ifndef SAMPLERD_SERVER_SHM_REGION_H_
#define SAMPLERD_SERVER_SHM_REGION_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace samplerd {

struct ShmOpenOptions {
  // uids whose objects may be registered; empty = the server's own effective uid only.
  std::vector<uid_t> allowed_owners;
};

class ShmRegion final {
 public:
  // Opens shm object `shm_name` ("/name") read-only; its first `byte_size` bytes are the
  // region. Errors name the field: INVALID_ARGUMENT for a bad name or size; NOT_FOUND when the
  // object does not exist; PERMISSION_DENIED for an object no allowed uid owns;
  // FAILED_PRECONDITION when it is not a regular file (a FIFO, a directory, a link) or is
  // smaller than byte_size.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Open(const std::string& shm_name,
                                                         int64_t byte_size,
                                                         const ShmOpenOptions& options);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  int64_t byte_size() const { return byte_size_; }
  const std::string& name() const { return name_; }

  // Copies bytes [offset, offset + bytes) of the region into `dst`. The range must lie within
  // byte_size() (the caller checked it). FAILED_PRECONDITION naming `field` when the object
  // shrank below the range after registration (the worker truncated it).
  absl::Status Read(int64_t offset, int64_t bytes, void* dst, const std::string& field) const;

 private:
  ShmRegion(int fd, int64_t byte_size, std::string name)
      : fd_(fd), byte_size_(byte_size), name_(std::move(name)) {}
  const int fd_;
  const int64_t byte_size_;
  const std::string name_;
};

// Parses a comma-separated list of uids (the --shm_allowed_uids flag); "" = none.
absl::StatusOr<std::vector<uid_t>> ParseUidList(const std::string& text);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SHM_REGION_H_
