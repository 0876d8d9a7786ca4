// A POSIX shared-memory object that a worker registered as a HOST_SHM region, mapped read-only
// and read in place, safely.
//
// The worker owns the object and may shrink it (ftruncate) at any time; reading a mapped page
// past the new end raises SIGBUS, which would kill the server. A process-wide SIGBUS handler
// owns that case: when the faulting address lies in a registered mapping, it maps zero pages
// over the rest of it (as Wayland's wl_shm does), marks the region faulted and lets the read
// go on; the step that read it is then failed by Intact(). A fault anywhere else goes to the
// previous handler. So a shrink costs the step that meets it, never the process, and reads
// need no copy. Opening never blocks (O_NONBLOCK: a FIFO would block open() forever) and never
// follows a link, and only regular files owned by an allowed uid are accepted, so a client
// cannot make the server read another user's memory even when the server runs as root.
//
//   ShmOpenOptions options;  // allowed owner: the server's own uid
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmRegion> region,
//                    ShmRegion::Open("/worker0-logits", size, options));
//   ASSIGN_OR_RETURN(const void* bytes, region->Slice(offset, n, "logits.buffer"));
//   ... read bytes ...
//   RETURN_IF_ERROR(region->Intact("logits.buffer", offset + n));  // read what was written
#ifndef SAMPLERD_SERVER_SHM_REGION_H_
#define SAMPLERD_SERVER_SHM_REGION_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace samplerd {

struct ShmOpenOptions {
  // uids whose objects may be registered; empty = the server's own effective uid only.
  std::vector<uid_t> allowed_owners;
  // Mapped read-write (a step channel, which samplerd answers into); else read-only.
  bool writable = false;
  // The uid of the client asking (issue 45: samplerd must not be a deputy that reads for a
  // client what it could not read itself). Set and not 0 (root opens anything): the object
  // must be owned by it, besides being owned by an allowed uid.
  std::optional<uid_t> opener;
};

class ShmRegion final {
 public:
  // Opens shm object `shm_name` ("/name") read-only (read-write where options.writable) and
  // maps its first `byte_size` bytes.
  // Errors name the field: INVALID_ARGUMENT for a bad name or size; NOT_FOUND when the object
  // does not exist; PERMISSION_DENIED for an object no allowed uid owns; FAILED_PRECONDITION
  // when it is not a regular file (a FIFO, a directory, a link), is smaller than byte_size or
  // cannot be mapped; RESOURCE_EXHAUSTED when kMaxMappings regions are open.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Open(const std::string& shm_name,
                                                         int64_t byte_size,
                                                         const ShmOpenOptions& options);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  int64_t byte_size() const { return byte_size_; }
  // The whole mapping: for pinning it (cudaHostRegister); reads go through Slice.
  const void* data() const { return data_; }
  // A writable region's mapping (null for a read-only one). Writes past a shrink land in the
  // zero pages the SIGBUS handler maps, so they never fault twice; Intact() then fails.
  void* mutable_data() const { return writable_ ? const_cast<void*>(data_) : nullptr; }
  const std::string& name() const { return name_; }

  // Bytes [offset, offset + bytes) of the region, in place; the range must lie within
  // byte_size() (the caller checked it). FAILED_PRECONDITION naming `field` when the object is
  // already smaller than the range, or an earlier read of it faulted.
  absl::StatusOr<const void*> Slice(int64_t offset, int64_t bytes, const std::string& field) const;

  // After the reads of bytes [.., end): OK when no read of this region has faulted since it
  // was opened and the object still holds `end` bytes (what was read is the object's
  // content); else FAILED_PRECONDITION naming `field`. The size check covers reads that
  // cannot fault: a device's DMA from the pinned mapping reads the old pages after a shrink.
  absl::Status Intact(const std::string& field, int64_t end) const;

  // Regions mapped at once, process-wide (the SIGBUS handler's table).
  static constexpr int kMaxMappings = 4096;

 private:
  ShmRegion(int fd, const void* data, int64_t byte_size, int slot, std::string name,
            bool writable)
      : fd_(fd), data_(data), byte_size_(byte_size), slot_(slot), name_(std::move(name)),
        writable_(writable) {}
  absl::Status ShrankError(const std::string& field) const;

  const int fd_;
  const void* const data_;
  const int64_t byte_size_;
  const int slot_;  // in the SIGBUS handler's table
  const std::string name_;
  const bool writable_;
};

// Parses a comma-separated list of uids (the --shm_allowed_uids flag); "" = none.
absl::StatusOr<std::vector<uid_t>> ParseUidList(const std::string& text);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_SHM_REGION_H_
