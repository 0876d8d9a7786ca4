// What the group tests ask samplerd through a raw stub (both the in-process one and the
// multi-GPU one): a group's state, and a unary Sample.
#ifndef SAMPLERD_TESTS_GROUP_RPC_H_
#define SAMPLERD_TESTS_GROUP_RPC_H_

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <string>

#include "samplerd/v1/sampler.grpc.pb.h"

namespace samplerd {

// The state GetServerInfo reports for group `id`; GROUP_STATE_UNSPECIFIED when there is none.
inline v1::GroupState GroupStateOf(v1::Sampler::Stub& stub, const std::string& id) {
  v1::GetServerInfoResponse info;
  grpc::ClientContext context;
  EXPECT_TRUE(stub.GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  for (const v1::GroupInfo& g : info.groups()) {
    if (g.group_id() == id) return g.state();
  }
  return v1::GROUP_STATE_UNSPECIFIED;
}

inline grpc::Status SampleOnce(v1::Sampler::Stub& stub, const v1::SampleRequest& request,
                               v1::SampleResponse* response) {
  grpc::ClientContext context;
  return stub.Sample(&context, request, response);
}

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_GROUP_RPC_H_
