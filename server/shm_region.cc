#include "server/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Open(const std::string& shm_name,
                                                           int64_t byte_size) {
  if (shm_name.size() < 2 || shm_name[0] != '/' || shm_name.find('/', 1) != std::string::npos ||
      shm_name.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm_name: '", shm_name, "' must be a POSIX shared-memory name: '/' then 1-254 "
        "characters without '/'"));
  }
  if (byte_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("byte_size: ", byte_size, " must be > 0"));
  }
  const int fd = shm_open(shm_name.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("shm_name: no shared-memory object '", shm_name, "'"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("shm_name: cannot open '", shm_name, "': ", std::strerror(err)));
  }
  struct stat info;
  if (fstat(fd, &info) != 0 || info.st_size < byte_size) {
    const int64_t actual = fstat(fd, &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "byte_size: ", byte_size, " exceeds the ", actual, " bytes of '", shm_name, "'"));
  }
  void* data = mmap(nullptr, static_cast<size_t>(byte_size), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the object alive
  if (data == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm_name: cannot map '", shm_name, "': ", std::strerror(err)));
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(data, byte_size));
}

ShmRegion::~ShmRegion() { munmap(const_cast<void*>(data_), static_cast<size_t>(byte_size_)); }

}  // namespace samplerd
