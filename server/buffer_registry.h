// Named regions that steps read logits from: POSIX shared memory (HOST_SHM) now, CUDA IPC
// regions with the CUDA backend. Also the server's LogitsSourceResolver: every slice is checked
// against the region's byte_size before any read, and a step holds a lease on the region so
// that UnregisterBuffer never unmaps memory a step is reading. HOST_SHM slices are read in
// place; a worker that shrinks its object fails its own step, never the server (ShmRegion
// says how).
//
//   BufferRegistry registry(BufferRegistryOptions{});
//   RETURN_IF_ERROR(registry.Register(request));
//   ASSIGN_OR_RETURN(auto converted, StepFromProto(sample_request, &registry));
#ifndef SAMPLERD_SERVER_BUFFER_REGISTRY_H_
#define SAMPLERD_SERVER_BUFFER_REGISTRY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "samplerd/v1/sampler.pb.h"
#include "server/device_memory.h"
#include "pipeline/proto_convert.h"
#include "server/shm_region.h"

namespace samplerd {

struct BufferRegistryOptions {
  int max_buffers = 1024;  // registered regions; RESOURCE_EXHAUSTED beyond
  // The GPU backend's opener of CUDA IPC memory, or null (CUDA IPC is FAILED_PRECONDITION).
  DeviceMemoryOpener* device = nullptr;
  ShmOpenOptions shm;
};

class BufferRegistry final : public LogitsSourceResolver {
 public:
  explicit BufferRegistry(const BufferRegistryOptions& options);
  BufferRegistry(const BufferRegistry&) = delete;
  BufferRegistry& operator=(const BufferRegistry&) = delete;
  // How HOST_SHM objects are opened (allowed owners): step channels open theirs alike.
  const ShmOpenOptions& shm_options() const { return shm_options_; }

  // Errors: INVALID_ARGUMENT (empty name, bad kind, bad handle or size), ALREADY_EXISTS,
  // NOT_FOUND (no such shm object), PERMISSION_DENIED (an shm object no allowed uid owns),
  // FAILED_PRECONDITION (object too small or not a regular file; CUDA_IPC without the CUDA
  // backend), RESOURCE_EXHAUSTED (too many regions). Returns the region as List shows it
  // (pinned or why not, for HOST_SHM on the CUDA backend).
  // `owner` (BufferInfo.owner) is the client the region belongs to: ReleaseOwner drops it, and
  // only steps of that owner may read it. `shm` (null: shm_options()) opens a HOST_SHM object
  // for this caller (ShmOpenOptions::opener).
  absl::StatusOr<v1::BufferInfo> Register(const v1::RegisterBufferRequest& request,
                                          const std::string& owner = "",
                                          const ShmOpenOptions* shm = nullptr);
  // Removes `name` if `owner` owns it; its memory stays mapped until the last step reading it
  // finishes. NOT_FOUND for an unknown name or another owner's (whose names are not told).
  absl::Status Unregister(const std::string& name, const std::string& owner);
  // `owner`'s regions, by name.
  std::vector<v1::BufferInfo> List(const std::string& owner) const;
  int Size() const;
  // The owner of `name`, or "" when no such region.
  std::string OwnerOf(const std::string& name) const;
  // How many regions `owner` holds.
  int CountOwnedBy(const std::string& owner) const;
  // Drops every region of `owner` and the one-off handles and ready events it used last; their
  // memory is unmapped (CUDA IPC mappings closed) once the last step reading it finishes.
  struct Released {
    int regions = 0;
    int handles = 0;    // one-off cuda_ipc allocations and ready events
    int64_t bytes = 0;  // the regions' byte_size
  };
  Released ReleaseOwner(const std::string& owner);
  // Bytes of the registered regions and cached one-off allocations.
  int64_t BytesHeld() const;

  // Resolve and ResolveReadyEvent for a step of `owner`: a registered region must be `owner`'s
  // (another owner's is NOT_FOUND, as an unknown name); a one-off handle or event it opens or
  // reuses is then `owner`'s, released with it. (The LogitsSourceResolver methods below are
  // these with no owner: any region, for in-process callers with no clients.)
  absl::StatusOr<const void*> ResolveFor(const std::string& owner, const v1::Tensor& tensor,
                                         int64_t byte_extent, const std::string& field,
                                         bool* on_device, std::shared_ptr<const void>* lease,
                                         std::function<absl::Status()>* verify);
  absl::StatusOr<const void*> ResolveReadyEventFor(const std::string& owner,
                                                   const std::string& handle,
                                                   const std::string& field,
                                                   std::shared_ptr<const void>* lease);

  // ResolveOutput for a step of `owner`: only `owner`'s regions registered for output.
  absl::StatusOr<void*> ResolveOutputFor(const std::string& owner, const v1::BufferSlice& slice,
                                         int64_t byte_extent, const std::string& field,
                                         std::shared_ptr<const void>* lease);

  absl::StatusOr<const void*> Resolve(const v1::Tensor& tensor, int64_t byte_extent,
                                      const std::string& field, bool* on_device,
                                      std::shared_ptr<const void>* lease,
                                      std::function<absl::Status()>* verify) override;
  absl::StatusOr<const void*> ResolveReadyEvent(const std::string& handle,
                                                const std::string& field,
                                                std::shared_ptr<const void>* lease) override;

  absl::StatusOr<void*> ResolveOutput(const v1::BufferSlice& slice, int64_t byte_extent,
                                      const std::string& field,
                                      std::shared_ptr<const void>* lease) override;

  // One-off cuda_ipc handles and ready events stay open for reuse, up to this many each.
  static constexpr size_t kHandleCacheSize = 64;

 private:
  struct Region {
    v1::BufferInfo info;
    std::unique_ptr<ShmRegion> shm;          // HOST_SHM
    // HOST_SHM with the CUDA backend: the mapping page-locked (info.pinned), released before
    // `shm` unmaps it (members are destroyed in reverse order).
    std::shared_ptr<const void> pinned;
    std::shared_ptr<const void> device;      // CUDA_IPC: keeps the mapping open
    const void* data = nullptr;              // CUDA_IPC: the region's first device byte
    int64_t bytes = 0;                       // readable bytes from data
    bool on_device = false;
  };
  // A CUDA IPC source's device_id: the server's device, or a peer GPU it can read by peer
  // access (DeviceMemoryOpener::CanAccessPeer); else FAILED_PRECONDITION naming `field`.
  absl::Status CheckDevice(int device_id, const std::string& field) const;
  // Opens (or finds) a one-off cuda_ipc handle's whole allocation.
  absl::StatusOr<std::shared_ptr<const Region>> OneOffRegion(const CudaIpcHandle& handle,
                                                             int device, const std::string& owner);
  struct OneOff {
    std::string key;  // the handle's bytes
    std::shared_ptr<const Region> region;
    std::string owner;
  };
  struct CachedEvent {
    std::string handle;
    std::shared_ptr<const void> entry;
    std::string owner;
  };

  const int max_buffers_;
  DeviceMemoryOpener* const device_;  // borrowed; may be null
  const ShmOpenOptions shm_options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Region>> regions_ ABSL_GUARDED_BY(mu_);
  // Bounded caches, oldest first out (leases keep an evicted entry open while in use).
  std::vector<OneOff> one_off_ ABSL_GUARDED_BY(mu_);
  std::vector<CachedEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_BUFFER_REGISTRY_H_
