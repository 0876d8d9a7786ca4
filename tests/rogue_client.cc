// A client of another user (issue 45's identity attacks): drops to --uid before it makes any
// gRPC object, then makes one call with whatever client id it claims, and prints the outcome
// as "CODE message" (CODE: the gRPC status code's number) on one line. A separate process, as
// another user's process on samplerd's host is.
//
//   rogue_client --target=127.0.0.1:PORT --uid=65534 --client_id=victim register SHM_NAME BYTES
//   rogue_client ... stream-cancel   # a SampleStream under that id, one inline step, cancelled
//   rogue_client ... list            # prints "0 N" and then the N buffer names
#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "grpcpp/grpcpp.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

int Print(const grpc::Status& status) {
  std::printf("%d %s\n", static_cast<int>(status.error_code()), status.error_message().c_str());
  return 0;
}

int Run(int argc, char** argv) {
  std::string target, client_id, action;
  int uid = -1;
  int first_arg = argc;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (absl::StartsWith(a, "--target=")) {
      target = a.substr(9);
    } else if (absl::StartsWith(a, "--uid=")) {
      if (!absl::SimpleAtoi(a.substr(6), &uid)) return 2;
    } else if (absl::StartsWith(a, "--client_id=")) {
      client_id = a.substr(12);
    } else {
      action = a;
      first_arg = i + 1;
      break;
    }
  }
  if (target.empty() || action.empty()) {
    std::fprintf(stderr, "usage: rogue_client --target=T [--uid=U] [--client_id=ID] ACTION ...\n");
    return 2;
  }
  if (uid >= 0 && (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0)) {
    std::perror("rogue_client: dropping to --uid");
    return 3;
  }
  auto stub = v1::Sampler::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  if (!client_id.empty()) context.AddMetadata("samplerd-client-id", client_id);
  if (action == "register" && argc - first_arg == 2) {
    v1::RegisterBufferRequest request;
    request.set_name("stolen");
    request.set_kind(v1::HOST_SHM);
    request.set_shm_name(argv[first_arg]);
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(argv[first_arg + 1], &bytes)) return 2;
    request.set_byte_size(bytes);
    v1::RegisterBufferResponse response;
    return Print(stub->RegisterBuffer(&context, request, &response));
  }
  if (action == "stream-cancel") {
    auto stream = stub->SampleStream(&context);
    v1::SampleResponse response;
    if (!stream->Write(SmallStep(1)) || !stream->Read(&response)) return Print(stream->Finish());
    context.TryCancel();  // goes away as a killed worker would
    return Print(stream->Finish());
  }
  if (action == "list") {
    v1::ListBuffersResponse response;
    const grpc::Status status = stub->ListBuffers(&context, v1::ListBuffersRequest(), &response);
    if (!status.ok()) return Print(status);
    std::printf("0 %d\n", response.buffers_size());
    for (const v1::BufferInfo& info : response.buffers()) std::printf("%s\n", info.name().c_str());
    return 0;
  }
  std::fprintf(stderr, "rogue_client: unknown action '%s'\n", action.c_str());
  return 2;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) { return samplerd::Run(argc, argv); }
