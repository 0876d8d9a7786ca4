// A model worker that registers a large HOST_SHM region and is then killed (issue 26's
// dead-worker test): a separate process, as a PyTorch engine beside the samplerd sidecar is.
//
//   shm_worker --target=127.0.0.1:PORT --name=worker-pool --bytes=67108864 [--idle]
//
// Creates a POSIX shm object of --bytes, registers it as --name (RegisterShm unlinks the
// object's name at once), and samples 4 steps from it on a SampleStream. Then prints "READY"
// and sleeps until killed: with --idle it first closes the stream (only its keep-alive shows
// it is alive), else it keeps the stream open. Exits 1 (and says why) on any failure.
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "client/sampler_client.h"
#include "client/shm_buffer.h"
#include "tests/test_steps.h"

namespace samplerd {
namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::cerr << "shm_worker: " << what << ": " << status << std::endl;
  return 1;
}

int Run(const std::string& target, const std::string& name, int64_t bytes, bool idle) {
  auto client = SamplerClient::Connect(target);
  if (!client.ok()) return Fail("connect", client.status());
  auto shm = ShmBuffer::Create("/samplerd-worker-" + std::to_string(getpid()), bytes);
  if (!shm.ok()) return Fail("create", shm.status());
  // Logits of a 64-token vocabulary in the region's first rows; the rest is touched so that
  // every page is really there (the memory a dead worker would leave behind).
  const v1::SampleRequest inline_step = SmallStep(1, 4, 64);
  std::memset((*shm)->data(), 1, static_cast<size_t>(bytes));
  std::memcpy((*shm)->data(), inline_step.logits().values().values().data(), 4 * 64 * 4);
  if (absl::Status s = (*client)->RegisterShm(name, **shm); !s.ok()) return Fail("register", s);
  auto stream = (*client)->OpenStream();
  if (!stream.ok()) return Fail("stream", stream.status());
  v1::SampleRequest step = inline_step;
  step.mutable_logits()->clear_values();
  step.mutable_logits()->set_dtype(v1::FLOAT32);
  step.mutable_logits()->mutable_buffer()->set_name(name);
  for (int i = 0; i < 4; ++i) {
    step.set_step_id(i + 1);
    auto reply = (*stream)->Step(step);
    if (!reply.ok()) return Fail("step", reply.status());
    if (reply->has_error()) return Fail("step", absl::InternalError(reply->error().message()));
    for (const auto& r : reply->results()) {
      if (r.status().code() != 0) return Fail("request", absl::InternalError(r.status().message()));
    }
  }
  if (idle) {
    if (absl::Status s = (*stream)->Close(); !s.ok()) return Fail("close", s);
  }
  std::cout << "READY" << std::endl;
  for (;;) pause();  // until SIGKILL
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  std::string target, name = "worker-pool";
  int64_t bytes = 64 << 20;
  bool idle = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--target=")) {
      target = arg.substr(9);
    } else if (absl::StartsWith(arg, "--name=")) {
      name = arg.substr(7);
    } else if (absl::StartsWith(arg, "--bytes=") && absl::SimpleAtoi(arg.substr(8), &bytes)) {
    } else if (arg == "--idle") {
      idle = true;
    } else {
      std::cerr << "shm_worker: bad argument " << arg << std::endl;
      return 2;
    }
  }
  return samplerd::Run(target, name, bytes, idle);
}
