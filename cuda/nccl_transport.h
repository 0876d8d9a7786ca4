// Context-parallel groups over NCCL: the GroupTransport of the CUDA backend. samplerd is rank
// 0 of each communicator, created non-blocking (ncclCommInitRankConfig with blocking = 0) so
// the group registry can bound the join and abort it; broadcasts and receives run on the
// group's own CUDA stream, their completion observed with an event.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> nccl, NcclTransport::Create(device));
//   GroupRegistry groups(nccl.get(), options);
#ifndef SAMPLERD_CUDA_NCCL_TRANSPORT_H_
#define SAMPLERD_CUDA_NCCL_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "sampler/group_transport.h"

namespace samplerd {

class NcclTransport final : public GroupTransport {
 public:
  // For groups on CUDA `device` (CreateGroup's device_id must name it). Errors: UNAVAILABLE
  // when the NCCL library cannot be used.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(int device);

  absl::StatusOr<std::string> NewUniqueId() override;
  absl::StatusOr<std::unique_ptr<GroupComm>> StartJoin(const std::string& unique_id,
                                                       const GroupConfig& config) override;
  std::string Describe() const override { return description_; }

 private:
  NcclTransport(int device, std::string description)
      : device_(device), description_(std::move(description)) {}
  const int device_;
  const std::string description_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CUDA_NCCL_TRANSPORT_H_
