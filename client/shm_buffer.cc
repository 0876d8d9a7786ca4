#include "client/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace samplerd {

namespace {

// After `what` failed (errno set): closes and unlinks the new object `name`, and says why.
absl::Status Discard(int fd, const std::string& name, const char* what) {
  const int err = errno;
  close(fd);
  shm_unlink(name.c_str());
  return absl::InternalError(absl::StrCat(what, " ", name, ": ", std::strerror(err)));
}

// A new shm object `name` of `byte_size` bytes, created exclusively with mode 0600: its
// descriptor, or ALREADY_EXISTS when the name is taken. A failure leaves nothing behind.
absl::StatusOr<int> CreateObject(const std::string& name, int64_t byte_size) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return absl::AlreadyExistsError(absl::StrCat(name, " exists"));
    return absl::InternalError(absl::StrCat("shm_open ", name, ": ", std::strerror(err)));
  }
  if (ftruncate(fd, byte_size) != 0) return Discard(fd, name, "ftruncate");
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmBuffer>> ShmBuffer::Create(const std::string& shm_name,
                                                             int64_t byte_size) {
  if (shm_name.size() < 2 || shm_name[0] != '/' || shm_name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("shm_name: '", shm_name, "' must be '/name'"));
  }
  if (byte_size <= 0) return absl::InvalidArgumentError("byte_size: must be > 0");
  absl::StatusOr<int> fd = CreateObject(shm_name, byte_size);
  if (!fd.ok()) return fd.status();
  void* data = mmap(nullptr, static_cast<size_t>(byte_size), PROT_READ | PROT_WRITE, MAP_SHARED,
                    *fd, 0);
  if (data == MAP_FAILED) return Discard(*fd, shm_name, "mmap");
  return std::unique_ptr<ShmBuffer>(new ShmBuffer(shm_name, *fd, data, byte_size));
}

void ShmBuffer::Unlink() {
  if (unlinked_) return;
  shm_unlink(shm_name_.c_str());
  unlinked_ = true;
}

absl::Status ShmBuffer::Relink() {
  absl::StatusOr<int> fd = absl::AlreadyExistsError("");
  std::string name;
  for (int attempt = 0; attempt < 64 && absl::IsAlreadyExists(fd.status()); ++attempt) {
    name = absl::StrCat(base_name_, ".", ++generation_);
    fd = CreateObject(name, byte_size_);
  }
  if (!fd.ok()) return fd.status();
  // The contents first (from the old mapping into the new object), then the new object is
  // mapped over the old one at the same address.
  const char* from = static_cast<const char*>(data_);
  for (int64_t done = 0; done < byte_size_;) {
    const ssize_t n = pwrite(*fd, from + done, static_cast<size_t>(byte_size_ - done), done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Discard(*fd, name, "pwrite");
    done += n;
  }
  if (mmap(data_, static_cast<size_t>(byte_size_), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
           *fd, 0) == MAP_FAILED) {
    return Discard(*fd, name, "mmap");
  }
  close(fd_);
  Unlink();
  fd_ = *fd;
  shm_name_ = std::move(name);
  unlinked_ = false;
  return absl::OkStatus();
}

ShmBuffer::~ShmBuffer() {
  munmap(data_, static_cast<size_t>(byte_size_));
  close(fd_);
  Unlink();
}

}  // namespace samplerd
