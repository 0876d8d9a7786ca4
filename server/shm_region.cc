#include "server/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace samplerd {

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Open(const std::string& shm_name,
                                                           int64_t byte_size,
                                                           const ShmOpenOptions& options) {
  if (shm_name.size() < 2 || shm_name[0] != '/' || shm_name.find('/', 1) != std::string::npos ||
      shm_name.size() > 255 || shm_name == "/." || shm_name == "/..") {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm_name: '", shm_name, "' must be a POSIX shared-memory name: '/' then 1-254 "
        "characters without '/'"));
  }
  if (byte_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("byte_size: ", byte_size, " must be > 0"));
  }
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  // O_NOFOLLOW: a symlink under /dev/shm must not lead the server to another file.
  const int fd = shm_open(shm_name.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("shm_name: no shared-memory object '", shm_name, "'"));
    }
    if (err == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat("shm_name: '", shm_name, "' is a symbolic link; register the object itself"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("shm_name: cannot open '", shm_name, "': ", std::strerror(err)));
  }
  auto fail = [fd](absl::Status status) {
    close(fd);
    return status;
  };
  struct stat info;
  if (fstat(fd, &info) != 0) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("shm_name: cannot stat '", shm_name, "': ", std::strerror(errno))));
  }
  if (!S_ISREG(info.st_mode)) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "shm_name: '", shm_name, "' is not a regular shared-memory object (a FIFO, device or "
        "directory)")));
  }
  const std::vector<uid_t> own = {geteuid()};
  const std::vector<uid_t>& allowed = options.allowed_owners.empty() ? own : options.allowed_owners;
  if (std::find(allowed.begin(), allowed.end(), info.st_uid) == allowed.end()) {
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "shm_name: '", shm_name, "' is owned by uid ", info.st_uid,
        ", which the server does not accept (--shm_allowed_uids; default: the server's own uid ",
        geteuid(), ")")));
  }
  if (info.st_size < byte_size) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "byte_size: ", byte_size, " exceeds the ", static_cast<int64_t>(info.st_size),
        " bytes of '", shm_name, "'")));
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(fd, byte_size, shm_name));
}

ShmRegion::~ShmRegion() { close(fd_); }

absl::Status ShmRegion::Read(int64_t offset, int64_t bytes, void* dst,
                             const std::string& field) const {
  char* out = static_cast<char*>(dst);
  int64_t done = 0;
  while (done < bytes) {
    // pread moves at most 0x7ffff000 bytes a call.
    const size_t want = static_cast<size_t>(std::min<int64_t>(bytes - done, int64_t{1} << 30));
    const ssize_t got = pread(fd_, out + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": reading shared-memory object '", name_, "' failed: ", std::strerror(errno)));
    }
    if (got == 0) {
      struct stat info;
      const int64_t now = fstat(fd_, &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": shared-memory object '", name_, "' shrank to ", now,
          " bytes after it was registered with byte_size ", byte_size_,
          "; the slice ends at byte ", offset + bytes, " (re-register the buffer)"));
    }
    done += got;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uid_t>> ParseUidList(const std::string& text) {
  std::vector<uid_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint32_t uid;
    if (!absl::SimpleAtoi(part, &uid)) {
      return absl::InvalidArgumentError(absl::StrCat("'", part, "' is not a uid"));
    }
    out.push_back(static_cast<uid_t>(uid));
  }
  return out;
}

}  // namespace samplerd
