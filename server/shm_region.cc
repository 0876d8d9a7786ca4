#include "server/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace samplerd {

namespace {

// The SIGBUS handler's table of mapped regions. Only atomics: the handler reads it.
struct MappingSlot {
  std::atomic<int> used{0};
  std::atomic<uintptr_t> begin{0};  // 0 while the slot is being filled or emptied
  std::atomic<uintptr_t> end{0};
  std::atomic<int> faulted{0};
  std::atomic<int> prot{PROT_READ};  // the zero pages' protection: the mapping's
};
MappingSlot g_slots[ShmRegion::kMaxMappings];
struct sigaction g_previous_sigbus;
uintptr_t g_page_size = 4096;

// SIGBUS: a read past the end of a truncated object. In one of our mappings, map zero pages
// over the rest of it and mark it (the read then goes on and its step fails); elsewhere, put
// the previous handler back and return, so that the access faults again and gets it.
void OnSigbus(int signal, siginfo_t* info, void* context) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (MappingSlot& slot : g_slots) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin == 0 || address < begin) continue;
    const uintptr_t end = slot.end.load(std::memory_order_acquire);
    if (address >= end) continue;
    const uintptr_t page = address & ~(g_page_size - 1);
    void* zeros = mmap(reinterpret_cast<void*>(page), end - page,
                       slot.prot.load(std::memory_order_acquire),
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (zeros != MAP_FAILED) {
      slot.faulted.store(1, std::memory_order_release);
      return;
    }
    break;
  }
  sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  (void)signal;
  (void)context;
}

void InstallSigbusHandler() {
  g_page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &g_previous_sigbus);
}

int ClaimSlot(const void* data, int64_t bytes, int prot) {
  static std::once_flag installed;
  std::call_once(installed, InstallSigbusHandler);
  for (int i = 0; i < ShmRegion::kMaxMappings; ++i) {
    int expected = 0;
    if (!g_slots[i].used.compare_exchange_strong(expected, 1)) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
    const uintptr_t end = (begin + static_cast<uintptr_t>(bytes) + g_page_size - 1) &
                          ~(g_page_size - 1);
    g_slots[i].faulted.store(0, std::memory_order_relaxed);
    g_slots[i].prot.store(prot, std::memory_order_relaxed);
    g_slots[i].end.store(end, std::memory_order_relaxed);
    g_slots[i].begin.store(begin, std::memory_order_release);
    return i;
  }
  return -1;
}

void ReleaseSlot(int i) {
  g_slots[i].begin.store(0, std::memory_order_release);
  g_slots[i].used.store(0, std::memory_order_release);
}

}  // namespace

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
  const int fd = shm_open(shm_name.c_str(),
                          (options.writable ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC,
                          0);
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
  if (options.opener.has_value() && *options.opener != 0 && info.st_uid != *options.opener) {
    return fail(absl::PermissionDeniedError(absl::StrCat(
        "shm_name: '", shm_name, "' is owned by uid ", info.st_uid, ", not by the calling "
        "client's uid ", *options.opener, ": a client may register only shared memory it owns")));
  }
  if (info.st_size < byte_size) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "byte_size: ", byte_size, " exceeds the ", static_cast<int64_t>(info.st_size),
        " bytes of '", shm_name, "'")));
  }
  const int prot = options.writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* data = mmap(nullptr, static_cast<size_t>(byte_size), prot, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("shm_name: cannot map '", shm_name, "': ", std::strerror(errno))));
  }
  const int slot = ClaimSlot(data, byte_size, prot);
  if (slot < 0) {
    munmap(data, static_cast<size_t>(byte_size));
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("shm_name: ", kMaxMappings, " shared-memory regions are open")));
  }
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(fd, data, byte_size, slot, shm_name, options.writable));
}

ShmRegion::~ShmRegion() {
  // No step reads the region any more (they hold leases), so no fault can be in flight here.
  ReleaseSlot(slot_);
  munmap(const_cast<void*>(data_), static_cast<size_t>(byte_size_));
  close(fd_);
}

absl::Status ShmRegion::ShrankError(const std::string& field) const {
  struct stat info;
  const int64_t now = fstat(fd_, &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": shared-memory object '", name_, "' shrank to ", now,
      " bytes after it was registered with byte_size ", byte_size_,
      " (re-register the buffer)"));
}

absl::StatusOr<const void*> ShmRegion::Slice(int64_t offset, int64_t bytes,
                                             const std::string& field) const {
  // The same check before any read finds a shrink at once; one during the read is Intact's
  // after it.
  if (absl::Status intact = Intact(field, offset + bytes); !intact.ok()) return intact;
  return static_cast<const void*>(static_cast<const char*>(data_) + offset);
}

absl::Status ShmRegion::Intact(const std::string& field, int64_t end) const {
  struct stat info;
  if (g_slots[slot_].faulted.load(std::memory_order_acquire) != 0 || fstat(fd_, &info) != 0 ||
      static_cast<int64_t>(info.st_size) < end) {
    return ShrankError(field);
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
