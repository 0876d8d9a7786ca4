#include "client/run_local.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "samplerd/v1/sampler.pb.h"
#include "sampler/cpu_backend.h"
#include "pipeline/proto_convert.h"
#include "pipeline/step_pipeline.h"

namespace samplerd {
absl::StatusOr<v1::SampleRequestList> ParseStepsJson(const std::string& json, bool* single) {
  const absl::string_view text = absl::StripAsciiWhitespace(json);
  google::protobuf::util::JsonParseOptions parse;
  v1::SampleRequestList list;
  *single = false;
  google::protobuf::util::Status status;
  if (absl::StartsWith(text, "[")) {
    status = google::protobuf::util::JsonStringToMessage(absl::StrCat("{\"steps\":", text, "}"),
                                                         &list, parse);
  } else if (text.find("\"steps\"") != absl::string_view::npos &&
             google::protobuf::util::JsonStringToMessage(std::string(text), &list, parse).ok()) {
    return list;
  } else {
    *single = true;
    status = google::protobuf::util::JsonStringToMessage(std::string(text), list.add_steps(), parse);
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input is not a SampleRequest in protobuf JSON: ", status.message().as_string()));
  }
  return list;
}

absl::StatusOr<std::string> RunLocalJson(const std::string& json, const RunLocalOptions& options) {
  bool single = false;
  auto steps = ParseStepsJson(json, &single);
  if (!steps.ok()) return steps.status();
  CpuBackendOptions backend_options;
  backend_options.num_threads = options.num_threads;
  auto backend = CpuBackend::Create(backend_options);
  if (!backend.ok()) return backend.status();
  Limits limits;
  limits.max_top_logprobs = options.max_top_logprobs;
  StepEnvironment env;  // inline logits only; the draft pool's scope is ""
  env.limits = limits;
  env.seeds = RandomSeedSource();

  v1::SampleResponseList responses;
  for (int i = 0; i < steps->steps_size(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    const std::string where = single ? "" : absl::StrCat("steps[", i, "]: ");
    // Timing: compute is the backend's Sample, as the service reports it.
    struct Timer final : StepObserver {
      std::chrono::steady_clock::time_point computed, done;
      void BeforeSample() override { computed = std::chrono::steady_clock::now(); }
      void AfterSample() override { done = std::chrono::steady_clock::now(); }
    } timer;
    auto result = RunStep(steps->steps(i), **backend, env, &timer);
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat(where, result.status().message()));
    }
    const auto computed = timer.computed;
    const auto done = timer.done;
    v1::SampleResponse* response = responses.add_steps();
    ResultToProto(*result, response, steps->steps(i).packed_results());
    auto us = [](auto d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); };
    response->mutable_timing()->set_queue_us(0);
    response->mutable_timing()->set_compute_us(us(done - computed));
    response->mutable_timing()->set_total_us(us(done - start));
  }

  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  print.always_print_primitive_fields = false;
  std::string out;
  if (single) {
    google::protobuf::util::MessageToJsonString(responses.steps(0), &out, print);
    return out;
  }
  // A JSON array of responses: print each and join.
  out = "[\n";
  for (int i = 0; i < responses.steps_size(); ++i) {
    std::string one;
    google::protobuf::util::MessageToJsonString(responses.steps(i), &one, print);
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(one),
                    i + 1 < responses.steps_size() ? ",\n" : "\n");
  }
  out += "]";
  return out;
}

}  // namespace samplerd
