// The one conversion from absl::Status (inside samplerd) to grpc::Status (at the edge).
//
//   return ToGrpcStatus(converted.status());
#ifndef SAMPLERD_SERVER_GRPC_STATUS_UTIL_H_
#define SAMPLERD_SERVER_GRPC_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace samplerd {

// Same code (absl's and gRPC's numeric codes coincide), same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace samplerd

#endif  // SAMPLERD_SERVER_GRPC_STATUS_UTIL_H_
