// Fuzz target: a list of SampleRequests through the server's whole step path, without gRPC:
// RunStep, the pipeline samplerd runs (against a real BufferRegistry holding one registered shm
// region, so slices, extents and shm reads are exercised; the CPU backend's draft pool carried
// from step to step within one input), and ResultToProto. Limits are small so that each input runs
// in milliseconds. Inputs are serialized SampleRequestLists; seeds may be text format (first
// line "# textproto"). The custom mutator is structure-aware (fuzz/proto_mutator.h).
//
//   scripts/fuzz.sh step 600      # libFuzzer, ASan + UBSan, 10 minutes
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "fuzz/proto_mutator.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/text_format.h"
#include "samplerd/v1/sampler.pb.h"
#include "sampler/cpu_backend.h"
#include "sampler/memory_budget.h"
#include "server/buffer_registry.h"
#include "pipeline/proto_convert.h"
#include "pipeline/step_pipeline.h"

namespace samplerd {
namespace {

constexpr int64_t kRegionBytes = 64 << 10;

struct Harness {
  Harness() : budget(64 << 20), registry(BufferRegistryOptions()) {
    // Mutated strings that are not UTF-8 make protobuf log one line each: silence it.
    google::protobuf::SetLogHandler(nullptr);
    CpuBackendOptions options;
    options.num_threads = 1;
    options.draft_pool.capacity_bytes = 4 << 20;
    backend = std::move(*CpuBackend::Create(options));
    limits.max_rows = 256;
    limits.max_vocab_size = 1 << 14;
    limits.max_force_top_n = 1024;
    limits.max_requests = 64;
    // One registered HOST_SHM region named "fuzz" (64 KiB of small logits), unlinked at once:
    // the registry keeps its descriptor.
    const std::string name = "/samplerd-fuzz-" + std::to_string(getpid());
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0 && ftruncate(fd, kRegionBytes) == 0) {
      std::vector<float> values(kRegionBytes / 4);
      for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(i % 97);
      (void)!write(fd, values.data(), kRegionBytes);
      v1::RegisterBufferRequest request;
      request.set_name("fuzz");
      request.set_kind(v1::HOST_SHM);
      request.set_shm_name(name);
      request.set_byte_size(kRegionBytes);
      (void)registry.Register(request);
    }
    if (fd >= 0) close(fd);
    shm_unlink(name.c_str());
  }
  MemoryBudget budget;
  BufferRegistry registry;
  std::unique_ptr<CpuBackend> backend;
  Limits limits;
};

Harness& GetHarness() {
  static Harness* harness = new Harness();
  return *harness;
}

// Steps of the last input that reached the backend and came back whole (for the replay test:
// a seed that never gets there exercises conversion only).
int g_sampled_steps = 0;

// What every answer must satisfy, whatever the input (issue 27: the fuzzer only looked for
// crashes). A violation aborts, so libFuzzer and the replay test report it.
void CheckInvariants(const Step& step, const v1::SampleResponse& response) {
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "invariant broken: %s\n%s\n", what.c_str(),
                 response.ShortDebugString().c_str());
    std::abort();
  };
  if (response.results_size() != static_cast<int>(step.requests.size())) fail("one result per request");
  for (int i = 0; i < response.results_size(); ++i) {
    const v1::RequestResult& r = response.results(i);
    const RequestInputs& q = step.requests[i];
    if (r.request_id() != q.request_id) fail("results in request order");
    if (r.status().code() != 0) continue;
    if (r.token_ids().empty()) fail("an OK result carries tokens");
    for (int32_t t : r.token_ids()) {
      if (t < 0 || t >= step.vocab_size) fail("token ids in [0, vocab_size)");
    }
    if (step.kind == StepKind::kDecode) {
      const int drafts = q.num_rows - 1;
      if (r.num_accepted() < 0 || r.num_accepted() > drafts) fail("0 <= accepted <= drafts");
      if (r.token_ids_size() != r.num_accepted() + 1) fail("a DECODE emits accepted + 1 tokens");
    } else if (r.num_accepted() != 0) {
      fail("only DECODE accepts drafts");
    }
    if (r.logprobs_size() != r.token_ids_size()) fail("a logprob per token");
  }
}

bool ParseInput(const uint8_t* data, size_t size, v1::SampleRequestList* list) {
  static constexpr char kText[] = "# textproto";
  if (size >= sizeof(kText) - 1 && std::memcmp(data, kText, sizeof(kText) - 1) == 0) {
    return google::protobuf::TextFormat::ParseFromString(
        std::string(reinterpret_cast<const char*>(data), size), list);
  }
  return list->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace
}  // namespace samplerd

extern "C" int SamplerdFuzzStepsSampled() { return samplerd::g_sampled_steps; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;
  if (size > (1 << 20)) return 0;
  v1::SampleRequestList list;
  if (!ParseInput(data, size, &list)) return 0;
  Harness& h = GetHarness();
  g_sampled_steps = 0;
  std::vector<std::string> drafted;
  // The step as converted, for the invariants and the pool's cleanup.
  struct Seen final : StepObserver {
    Step step;
    void Planned(const ConvertedStep& converted, const StepPlan&) override { step = converted.step; }
  };
  StepEnvironment env;
  env.resolver = &h.registry;
  env.budget = &h.budget;
  env.limits = h.limits;
  env.seeds = [] { return uint64_t{42}; };
  env.pool_scope = "fuzz";
  // SAMPLERD_FUZZ_VERBOSE=1: say why a step stopped short of an answer (for seed authors).
  static const bool verbose = std::getenv("SAMPLERD_FUZZ_VERBOSE") != nullptr;
  for (int i = 0; i < list.steps_size() && i < 4; ++i) {
    Seen seen;
    auto result = RunStep(list.steps(i), *h.backend, env, &seen);
    if (!result.ok()) {
      if (verbose) std::fprintf(stderr, "step %d: %s\n", i, result.status().ToString().c_str());
      continue;
    }
    v1::SampleResponse response;
    ResultToProto(*result, &response);
    CheckInvariants(seen.step, response);
    ++g_sampled_steps;
    if (seen.step.kind == StepKind::kDraft) {
      for (const auto& r : seen.step.requests) drafted.push_back(r.request_id);
    }
  }
  // Inputs are independent: nothing stays in the pool.
  for (const std::string& id : drafted) h.backend->draft_pool().Release(DraftPoolKey("fuzz", id));
  return 0;
}

#ifdef SAMPLERD_LIBFUZZER
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  using namespace samplerd;
  std::mt19937_64 rng(seed);
  v1::SampleRequestList list;
  // One time in eight, plain byte mutations (they find what the structure cannot express).
  if (rng() % 8 == 0 || !ParseInput(data, size, &list)) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  const int mutations = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < mutations; ++i) MutateMessage(&list, rng);
  std::string out;
  if (!list.SerializeToString(&out) || out.size() > max_size) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  std::memcpy(data, out.data(), out.size());
  return out.size();
}
#endif
