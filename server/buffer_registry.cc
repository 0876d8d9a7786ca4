#include "server/buffer_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "sampler/extent.h"
#include "sampler/status_macros.h"
#include "server/cuda_ipc_handle.h"

namespace samplerd {

absl::StatusOr<v1::BufferInfo> BufferRegistry::Register(const v1::RegisterBufferRequest& request,
                                                        const std::string& owner,
                                                        const ShmOpenOptions* shm_options) {
  if (request.name().empty()) return absl::InvalidArgumentError("name: required");
  if (request.byte_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte_size: ", request.byte_size(), " must be > 0"));
  }
  auto region = std::make_shared<Region>();
  region->info.set_name(request.name());
  region->info.set_kind(request.kind());
  region->info.set_byte_size(request.byte_size());
  region->info.set_device_id(request.device_id());
  region->info.set_owner(owner);
  if (request.output() && request.kind() != v1::CUDA_IPC) {
    return absl::InvalidArgumentError(
        "output: only CUDA_IPC regions take a step's tokens (StepOutput)");
  }
  region->info.set_output(request.output());
  switch (request.kind()) {
    case v1::HOST_SHM: {
      auto shm = ShmRegion::Open(request.shm_name(), request.byte_size(),
                                 shm_options != nullptr ? *shm_options : shm_options_);
      if (!shm.ok()) return shm.status();
      region->shm = std::move(*shm);
      region->bytes = region->shm->byte_size();
      region->info.set_shm_name(request.shm_name());
      if (device_ != nullptr) {
        // The CUDA backend copies each step's logits from this region: pinned, they cross
        // PCIe by DMA. Unpinned (the driver refused) they are still copied, only slower.
        auto pinned = device_->PinHostMemory(region->shm->data(), region->bytes);
        if (pinned.ok()) {
          region->pinned = std::move(*pinned);
          region->info.set_pinned(true);
        } else {
          region->info.set_pin_error(std::string(pinned.status().message()));
        }
      }
      break;
    }
    case v1::CUDA_IPC: {
      auto handle = ParseCudaIpcHandle(request.cuda_ipc_handle(), "cuda_ipc_handle");
      if (!handle.ok()) return handle.status();
      if (device_ == nullptr) {
        return absl::FailedPreconditionError(
            "kind: CUDA_IPC regions need the CUDA backend; this server runs the cpu backend "
            "(use HOST_SHM or inline logits)");
      }
      if (auto peer = CheckDevice(request.device_id(), "device_id"); !peer.ok()) return peer;
      // Opened on the server's device: a peer's memory is mapped there by peer access.
      auto opened = device_->OpenMemory(*handle, request.byte_size(), device_->device(),
                                        &region->data, &region->bytes);
      if (!opened.ok()) return opened.status();
      region->device = std::move(*opened);
      region->on_device = true;
      break;
    }
    default:
      return absl::InvalidArgumentError("kind: required: HOST_SHM or CUDA_IPC");
  }
  absl::MutexLock lock(&mu_);
  if (auto it = regions_.find(request.name()); it != regions_.end()) {
    // Whose it is stays unsaid: owner ids are not public (issue 45).
    return absl::AlreadyExistsError(absl::StrCat(
        "name: a buffer named '", request.name(), "' is already registered",
        it->second->info.owner() == owner ? " by this client" : " by another client"));
  }
  if (static_cast<int>(regions_.size()) >= max_buffers_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("name: ", max_buffers_, " buffers are registered, the server's limit"));
  }
  v1::BufferInfo info = region->info;
  regions_.emplace(request.name(), std::move(region));
  return info;
}

absl::Status BufferRegistry::Unregister(const std::string& name, const std::string& owner) {
  std::shared_ptr<const Region> dropped;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(name);
  if (it == regions_.end() || it->second->info.owner() != owner) {
    return absl::NotFoundError(
        absl::StrCat("name: no buffer named '", name, "' registered by this client"));
  }
  dropped = std::move(it->second);
  regions_.erase(it);
  return absl::OkStatus();
}

std::string BufferRegistry::OwnerOf(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(name);
  return it == regions_.end() ? std::string() : it->second->info.owner();
}

int BufferRegistry::CountOwnedBy(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  int owned = 0;
  for (const auto& [name, region] : regions_) owned += region->info.owner() == owner;
  return owned;
}

BufferRegistry::Released BufferRegistry::ReleaseOwner(const std::string& owner) {
  // Dropped outside the lock: the last reference unmaps (or closes a CUDA IPC mapping).
  std::vector<std::shared_ptr<const void>> dropped;
  Released released;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->info.owner() == owner) {
        ++released.regions;
        released.bytes += it->second->info.byte_size();
        dropped.push_back(std::move(it->second));
        regions_.erase(it++);
      } else {
        ++it;
      }
    }
    for (auto it = one_off_.begin(); it != one_off_.end();) {
      if (it->owner == owner) {
        ++released.handles;
        dropped.push_back(std::move(it->region));
        it = one_off_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = events_.begin(); it != events_.end();) {
      if (it->owner == owner) {
        ++released.handles;
        dropped.push_back(std::move(it->entry));
        it = events_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return released;
}

int64_t BufferRegistry::BytesHeld() const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& [name, region] : regions_) bytes += region->info.byte_size();
  for (const OneOff& entry : one_off_) bytes += entry.region->info.byte_size();
  return bytes;
}

std::vector<v1::BufferInfo> BufferRegistry::List(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::BufferInfo> out;
  for (const auto& [name, region] : regions_) {
    if (region->info.owner() != owner) continue;
    v1::BufferInfo info = region->info;
    info.set_in_use(static_cast<int32_t>(region.use_count() - 1));  // leases held by steps
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const v1::BufferInfo& a, const v1::BufferInfo& b) { return a.name() < b.name(); });
  return out;
}

int BufferRegistry::Size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(regions_.size());
}

absl::StatusOr<const void*> BufferRegistry::Resolve(const v1::Tensor& tensor, int64_t byte_extent,
                                                    const std::string& field, bool* on_device,
                                                    std::shared_ptr<const void>* lease,
                                                    std::function<absl::Status()>* verify) {
  return ResolveFor("", tensor, byte_extent, field, on_device, lease, verify);
}

absl::StatusOr<const void*> BufferRegistry::ResolveReadyEvent(const std::string& handle,
                                                              const std::string& field,
                                                              std::shared_ptr<const void>* lease) {
  return ResolveReadyEventFor("", handle, field, lease);
}

absl::StatusOr<void*> BufferRegistry::ResolveOutput(const v1::BufferSlice& slice,
                                                    int64_t byte_extent, const std::string& field,
                                                    std::shared_ptr<const void>* lease) {
  return ResolveOutputFor("", slice, byte_extent, field, lease);
}

absl::StatusOr<void*> BufferRegistry::ResolveOutputFor(const std::string& owner,
                                                       const v1::BufferSlice& slice,
                                                       int64_t byte_extent,
                                                       const std::string& field,
                                                       std::shared_ptr<const void>* lease) {
  std::shared_ptr<const Region> region;
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(slice.name());
    if (it == regions_.end() || (!owner.empty() && it->second->info.owner() != owner)) {
      return absl::NotFoundError(absl::StrCat(field, ".name: no buffer named '", slice.name(),
                                              "'", owner.empty() ? "" : " registered by this client"));
    }
    region = it->second;
  }
  if (!region->on_device || !region->info.output()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".name: buffer '", slice.name(),
        "' was not registered for output (a CUDA_IPC region with output set)"));
  }
  if (slice.byte_offset() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".byte_offset: ", slice.byte_offset(),
                                                   " is not a multiple of 4"));
  }
  const int64_t size = region->info.byte_size();
  RETURN_IF_ERROR(CheckSliceWithin(slice.byte_offset(), byte_extent, size,
                                   field + ".byte_offset",
                                   absl::StrCat("buffer '", slice.name(), "' of ", size, " bytes")));
  *lease = region;
  // The mapping is the owner's memory, opened read-write; registered for output, it may be
  // written within the checked slice.
  return static_cast<char*>(const_cast<void*>(region->data)) + slice.byte_offset();
}

absl::StatusOr<const void*> BufferRegistry::ResolveFor(const std::string& owner,
                                                       const v1::Tensor& tensor,
                                                       int64_t byte_extent,
                                                       const std::string& field, bool* on_device,
                                                       std::shared_ptr<const void>* lease,
                                                       std::function<absl::Status()>* verify) {
  switch (tensor.source_case()) {
    case v1::Tensor::kBuffer: {
      const v1::BufferSlice& slice = tensor.buffer();
      std::shared_ptr<const Region> region;
      {
        absl::MutexLock lock(&mu_);
        auto it = regions_.find(slice.name());
        // Another client's region is as unknown as no region (issue 45: one certificate, or
        // one user, sampled another's logits).
        if (it == regions_.end() || (!owner.empty() && it->second->info.owner() != owner)) {
          return absl::NotFoundError(
              absl::StrCat(field, ".buffer.name: no buffer named '", slice.name(), "'",
                           owner.empty() ? "" : " registered by this client"));
        }
        region = it->second;
      }
      const int64_t size = region->info.byte_size();
      auto within = CheckSliceWithin(
          slice.byte_offset(), byte_extent, size, field + ".buffer.byte_offset",
          absl::StrCat("buffer '", slice.name(), "' of ", size, " bytes"));
      if (!within.ok()) return within;
      *on_device = region->on_device;
      if (region->on_device) {
        *lease = region;
        return static_cast<const void*>(static_cast<const char*>(region->data) +
                                        slice.byte_offset());
      }
      // Read in place; after the step, `verify` tells whether the object shrank under it.
      const std::string shm_field = field + ".buffer";
      auto data = region->shm->Slice(slice.byte_offset(), byte_extent, shm_field);
      if (!data.ok()) return data.status();
      const int64_t end = slice.byte_offset() + byte_extent;  // within size, checked above
      *verify = [region, shm_field, end] { return region->shm->Intact(shm_field, end); };
      *lease = region;
      return data;
    }
    case v1::Tensor::kCudaIpc: {
      const v1::CudaIpcRef& ref = tensor.cuda_ipc();
      auto handle = ParseCudaIpcHandle(ref.handle(), field + ".cuda_ipc.handle");
      if (!handle.ok()) return handle.status();
      if (device_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(field, ".cuda_ipc: CUDA IPC logits need the CUDA backend; this server "
                                "runs the cpu backend"));
      }
      if (auto peer = CheckDevice(ref.device_id(), field + ".cuda_ipc.device_id"); !peer.ok()) {
        return peer;
      }
      auto region = OneOffRegion(*handle, device_->device(), owner);
      if (!region.ok()) return region.status();
      const int64_t size = (*region)->bytes;
      auto within = CheckSliceWithin(
          ref.byte_offset(), byte_extent, size, field + ".cuda_ipc.byte_offset",
          absl::StrCat("the handle's allocation of ", size, " bytes"));
      if (!within.ok()) return within;
      *on_device = true;
      const void* data = static_cast<const char*>((*region)->data) + ref.byte_offset();
      *lease = *region;
      return data;
    }
    case v1::Tensor::kNccl:
      // The service receives NCCL logits inside the step's group turn and resolves them
      // itself (sampler_service.cc, StepResolver); a registry alone has no group.
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".nccl: NCCL logits are received through a context-parallel group"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ": not a registered-buffer source"));
  }
}

BufferRegistry::BufferRegistry(const BufferRegistryOptions& options)
    : max_buffers_(options.max_buffers),
      device_(options.device),
      shm_options_(options.shm) {}

absl::Status BufferRegistry::CheckDevice(int device_id, const std::string& field) const {
  if (device_id == device_->device() || device_->CanAccessPeer(device_id)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(field, ": ", device_id, " is not the server's CUDA device ", device_->device(),
                   " nor a peer GPU it can read by peer access"));
}

absl::StatusOr<std::shared_ptr<const BufferRegistry::Region>> BufferRegistry::OneOffRegion(
    const CudaIpcHandle& handle, int device, const std::string& owner) {
  const std::string key(handle.data(), handle.size());
  absl::MutexLock lock(&mu_);
  for (OneOff& entry : one_off_) {
    if (entry.key == key) {
      entry.owner = owner;  // the handle's latest user holds it now
      return entry.region;
    }
  }
  auto region = std::make_shared<Region>();
  auto opened = device_->OpenMemory(handle, 0, device, &region->data, &region->bytes);
  if (!opened.ok()) return opened.status();
  region->device = std::move(*opened);
  region->on_device = true;
  region->info.set_kind(v1::CUDA_IPC);
  region->info.set_byte_size(region->bytes);
  if (one_off_.size() >= kHandleCacheSize) one_off_.erase(one_off_.begin());
  one_off_.push_back(OneOff{key, region, owner});
  return std::shared_ptr<const Region>(region);
}

absl::StatusOr<const void*> BufferRegistry::ResolveReadyEventFor(
    const std::string& owner, const std::string& handle, const std::string& field,
    std::shared_ptr<const void>* lease) {
  if (handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", handle.size(), " bytes; a CUDA IPC event handle is 64 bytes"));
  }
  if (device_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(field, ": needs the CUDA backend"));
  }
  absl::MutexLock lock(&mu_);
  for (CachedEvent& cached : events_) {
    if (cached.handle == handle) {
      cached.owner = owner;
      *lease = cached.entry;
      return *static_cast<const void* const*>(cached.entry.get());
    }
  }
  CudaIpcHandle raw;
  std::copy(handle.begin(), handle.end(), raw.begin());
  const void* native = nullptr;
  auto opened = device_->OpenEvent(raw, device_->device(), &native);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), absl::StrCat(field, ": ", opened.status().message()));
  }
  // The cache holds {lease, native pointer} so that a hit can return the pointer.
  struct Held {
    const void* native;
    std::shared_ptr<const void> lease;
  };
  auto held = std::make_shared<Held>(Held{native, std::move(*opened)});
  std::shared_ptr<const void> entry(held, &held->native);
  if (events_.size() >= kHandleCacheSize) events_.erase(events_.begin());
  events_.push_back(CachedEvent{handle, entry, owner});
  *lease = entry;
  return native;
}

}  // namespace samplerd
