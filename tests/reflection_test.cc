// A client with no samplerd .proto at hand (this target does not link the generated samplerd
// code): it discovers the service through server reflection, as grpcurl does, builds the
// request from the reflected descriptors out of a JSON body, and calls Sample.
//
//   reflection_test SAMPLERD
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/server_process.h"

namespace samplerd {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
namespace reflection = grpc::reflection::v1alpha;

std::string g_samplerd;

class ReflectionClient {
 public:
  explicit ReflectionClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(reflection::ServerReflection::NewStub(channel)) {}

  std::vector<std::string> ListServices() {
    reflection::ServerReflectionRequest request;
    request.set_list_services("");
    std::vector<std::string> names;
    for (const auto& response : Ask(request)) {
      for (const auto& service : response.list_services_response().service()) {
        names.push_back(service.name());
      }
    }
    return names;
  }

  // Loads the file defining `symbol` (and what it imports) into `pool`.
  bool LoadSymbol(const std::string& symbol, google::protobuf::DescriptorPool* pool) {
    reflection::ServerReflectionRequest request;
    request.set_file_containing_symbol(symbol);
    std::vector<google::protobuf::FileDescriptorProto> files;
    for (const auto& response : Ask(request)) {
      for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
        google::protobuf::FileDescriptorProto file;
        if (!file.ParseFromString(bytes)) return false;
        files.push_back(file);
      }
    }
    // Dependencies come after their dependents in the answer: build in reverse.
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
      if (pool->FindFileByName(it->name()) == nullptr && pool->BuildFile(*it) == nullptr) {
        return false;
      }
    }
    return !files.empty();
  }

 private:
  std::vector<reflection::ServerReflectionResponse> Ask(
      const reflection::ServerReflectionRequest& request) {
    grpc::ClientContext context;
    auto stream = stub_->ServerReflectionInfo(&context);
    stream->Write(request);
    stream->WritesDone();
    std::vector<reflection::ServerReflectionResponse> out;
    reflection::ServerReflectionResponse response;
    while (stream->Read(&response)) out.push_back(response);
    EXPECT_TRUE(stream->Finish().ok());
    return out;
  }

  std::unique_ptr<reflection::ServerReflection::Stub> stub_;
};

// Calls `method` ("/pkg.Service/Method") with `request`; fills `response`.
grpc::Status GenericUnaryCall(grpc::Channel* channel, const std::string& method,
                              const google::protobuf::Message& request,
                              google::protobuf::Message* response) {
  grpc::GenericStub stub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  const std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer send(&slice, 1);
  auto call = stub.PrepareUnaryCall(&context, method, send, &cq);
  call->StartCall();
  grpc::ByteBuffer received;
  grpc::Status status;
  call->Finish(&received, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  if (!status.ok()) return status;
  std::vector<grpc::Slice> slices;
  received.Dump(&slices);
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (!response->ParseFromString(out)) return grpc::Status(grpc::StatusCode::INTERNAL, "parse");
  return grpc::Status::OK;
}

TEST(Reflection, ListsServicesAndCallsSampleFromJson) {
  ServerProcess server(g_samplerd, {});
  ASSERT_TRUE(server.Start().ok());
  auto channel = grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());
  ReflectionClient client(channel);
  const std::vector<std::string> services = client.ListServices();
  EXPECT_THAT(services, Contains("samplerd.v1.Sampler"));
  EXPECT_THAT(services, Contains("grpc.health.v1.Health"));

  // The health service is described too: `grpcurl -plaintext HOST grpc.health.v1.Health/Check`
  // resolves it this way.
  google::protobuf::DescriptorPool health_pool;
  ASSERT_TRUE(client.LoadSymbol("grpc.health.v1.Health", &health_pool));
  const auto* check = health_pool.FindMethodByName("grpc.health.v1.Health.Check");
  ASSERT_NE(check, nullptr);
  {
    // ... and called as grpcurl calls it: messages built from the reflected descriptors,
    // the answer printed as JSON (`{"status": "SERVING"}`).
    google::protobuf::DynamicMessageFactory health_factory(&health_pool);
    std::unique_ptr<google::protobuf::Message> check_request(
        health_factory.GetPrototype(check->input_type())->New());
    std::unique_ptr<google::protobuf::Message> check_response(
        health_factory.GetPrototype(check->output_type())->New());
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage("{}", check_request.get()).ok());
    const grpc::Status status = GenericUnaryCall(channel.get(), "/grpc.health.v1.Health/Check",
                                                 *check_request, check_response.get());
    ASSERT_TRUE(status.ok()) << status.error_message();
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(*check_response, &json).ok());
    EXPECT_EQ(json, R"({"status":"SERVING"})");
  }

  google::protobuf::DescriptorPool pool;
  ASSERT_TRUE(client.LoadSymbol("samplerd.v1.Sampler", &pool));
  const auto* service = pool.FindServiceByName("samplerd.v1.Sampler");
  ASSERT_NE(service, nullptr);
  for (const char* rpc : {"Sample", "SampleStream", "RegisterBuffer", "UnregisterBuffer",
                          "ListBuffers", "CreateGroup", "DestroyGroup", "GetServerInfo",
                          "Release"}) {
    EXPECT_NE(service->FindMethodByName(rpc), nullptr) << rpc;
  }
  const auto* method = service->FindMethodByName("Sample");
  ASSERT_NE(method, nullptr);

  google::protobuf::DynamicMessageFactory factory(&pool);
  std::unique_ptr<google::protobuf::Message> request(
      factory.GetPrototype(method->input_type())->New());
  std::unique_ptr<google::protobuf::Message> response(
      factory.GetPrototype(method->output_type())->New());
  const std::string body = R"({
    "stepId": "5",
    "logits": {"rows": 1, "cols": 4, "values": {"values": [0.5, 2.0, -1.0, 1.0]}},
    "inputs": {"kind": "PREFILL", "vocabSize": 4, "requests": [
      {"requestId": "grpcurl", "row": 0, "samplePosition": "41",
       "params": {"seqSeed": "1", "topLogprobs": 2, "topK": 2}}]}
  })";
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(body, request.get()).ok());
  const grpc::Status status =
      GenericUnaryCall(channel.get(), "/samplerd.v1.Sampler/Sample", *request, response.get());
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(*response, &json).ok());
  EXPECT_THAT(json, HasSubstr("\"stepId\":\"5\""));
  EXPECT_THAT(json, HasSubstr("\"requestId\":\"grpcurl\""));
  EXPECT_THAT(json, HasSubstr("\"seqSeed\":\"1\""));
  // top_k = 2 keeps tokens 1 and 3; their top logprobs come back in order.
  EXPECT_THAT(json, HasSubstr("\"topLogprobs\":[{\"tokenIds\":[1,3]"));
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) return 2;
  samplerd::g_samplerd = argv[1];
  return RUN_ALL_TESTS();
}
