// A POSIX shared-memory object the client creates and writes logits into, for HOST_SHM
// regions: the model worker's side of a registered buffer.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmBuffer> shm, ShmBuffer::Create("/worker0", bytes));
//   std::memcpy(shm->data(), logits, n);
//   client->RegisterShm("worker0-logits", *shm);   // unlinks the name once samplerd has it
//
// SamplerClient::RegisterShm unlinks the object's name as soon as samplerd has registered it:
// the memory lives on in the two mappings (this one, samplerd's), and a worker that crashes
// leaves no name in /dev/shm. samplerd unmaps its side when the worker is gone (its lease).
// The destructor unmaps, and unlinks the name if it is still there.
#ifndef SAMPLERD_CLIENT_SHM_BUFFER_H_
#define SAMPLERD_CLIENT_SHM_BUFFER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace samplerd {

class ShmBuffer final {
 public:
  // Creates `shm_name` ("/name"; must not exist) of `byte_size` bytes, zero-filled.
  // Errors: INVALID_ARGUMENT (bad name or size), ALREADY_EXISTS, INTERNAL (system call failed).
  static absl::StatusOr<std::unique_ptr<ShmBuffer>> Create(const std::string& shm_name,
                                                           int64_t byte_size);
  ~ShmBuffer();
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;

  void* data() { return data_; }
  int64_t byte_size() const { return byte_size_; }
  const std::string& shm_name() const { return shm_name_; }
  // The object's descriptor, open until destruction (the name may be gone by then).
  int fd() const { return fd_; }
  // Removes the name from /dev/shm (once; later calls do nothing). The memory stays.
  void Unlink();
  bool unlinked() const { return unlinked_; }
  // Moves the memory to a new object with a fresh name (shm_name() + ".N"), keeping its
  // contents and its address: data() and every pointer into it stay valid. For registering
  // the region again with a samplerd that restarted, since an unlinked name cannot be opened
  // again. Not safe while another thread writes into the buffer.
  absl::Status Relink();

 private:
  ShmBuffer(std::string shm_name, int fd, void* data, int64_t byte_size)
      : base_name_(shm_name), shm_name_(std::move(shm_name)), fd_(fd), data_(data),
        byte_size_(byte_size) {}
  const std::string base_name_;  // the name Create was given; Relink's names derive from it
  std::string shm_name_;
  int fd_;
  int generation_ = 0;
  void* const data_;
  const int64_t byte_size_;
  bool unlinked_ = false;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_SHM_BUFFER_H_
