// RunStep: the stages in order, what each failure returns, and the check after the read.
#include "pipeline/step_pipeline.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "sampler/cpu_backend.h"

namespace samplerd {
namespace {

v1::SampleRequest TinyStep(int cols) {
  v1::SampleRequest request;
  request.set_step_id(3);
  request.mutable_logits()->set_rows(1);
  request.mutable_logits()->set_cols(cols);
  for (int i = 0; i < cols; ++i) request.mutable_logits()->mutable_values()->add_values(0.1f * i);
  request.mutable_inputs()->set_kind(v1::PREFILL);
  request.mutable_inputs()->set_vocab_size(cols);
  auto* q = request.mutable_inputs()->add_requests();
  q->set_request_id("a");
  q->mutable_params()->set_seq_seed(5);
  q->mutable_params()->set_top_logprobs(2);
  return request;
}

std::unique_ptr<CpuBackend> Cpu() {
  auto backend = CpuBackend::Create({.num_threads = 1});
  EXPECT_TRUE(backend.ok());
  return std::move(*backend);
}

struct Recorder final : StepObserver {
  std::vector<std::string> events;
  void Planned(const ConvertedStep& converted, const StepPlan& plan) override {
    events.push_back("planned " + std::to_string(plan.requests.size()) + " " +
                     converted.step.pool_scope);
  }
  void BeforeSample() override { events.push_back("before"); }
  void AfterSample() override { events.push_back("after"); }
};

TEST(RunStep, RunsTheStagesInOrderAndAnswersAsTheStagesByHand) {
  auto backend = Cpu();
  StepEnvironment env;
  env.seeds = [] { return uint64_t{1}; };
  env.pool_scope = "id:w";
  Recorder recorder;
  auto result = RunStep(TinyStep(16), *backend, env, &recorder);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(recorder.events, (std::vector<std::string>{"planned 1 id:w", "before", "after"}));
  // By hand, on a second backend: the same answer.
  const v1::SampleRequest request = TinyStep(16);
  auto converted = StepFromProto(request, nullptr);
  ASSERT_TRUE(converted.ok());
  auto plan = PlanConvertedStep(**converted, Limits{}, env.seeds);
  ASSERT_TRUE(plan.ok());
  auto other = Cpu();
  auto by_hand = other->Sample(*plan);
  ASSERT_TRUE(by_hand.ok());
  ASSERT_EQ(result->results.size(), 1u);
  EXPECT_EQ(result->results[0].token_ids, by_hand->results[0].token_ids);
  EXPECT_EQ(result->results[0].logprobs, by_hand->results[0].logprobs);
  EXPECT_EQ(result->results[0].top_logprobs[0].token_ids,
            by_hand->results[0].top_logprobs[0].token_ids);
}

TEST(RunStep, AStepLevelFaultStopsBeforeTheBackend) {
  auto backend = Cpu();
  StepEnvironment env;
  env.seeds = [] { return uint64_t{1}; };
  Recorder recorder;
  v1::SampleRequest bad = TinyStep(16);
  bad.mutable_inputs()->set_vocab_size(1000);  // more than the columns
  auto result = RunStep(bad, *backend, env, &recorder);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("inputs.vocab_size"), std::string::npos)
      << result.status();
  EXPECT_TRUE(recorder.events.empty());
}

// A resolver whose one buffer turns out, after the read, not to be what its owner wrote (as a
// truncated shm object does): the step must fail after the backend ran, with that error.
class ChangedWhileRead final : public LogitsSourceResolver {
 public:
  absl::StatusOr<const void*> Resolve(const v1::Tensor&, int64_t byte_extent, const std::string&,
                                      bool* on_device, std::shared_ptr<const void>*,
                                      std::function<absl::Status()>* verify) override {
    bytes_.assign(static_cast<size_t>(byte_extent), 0);
    *on_device = false;
    *verify = [] { return absl::FailedPreconditionError("logits.buffer: changed while read"); };
    return static_cast<const void*>(bytes_.data());
  }
  absl::StatusOr<const void*> ResolveReadyEvent(const std::string&, const std::string& field,
                                                std::shared_ptr<const void>*) override {
    return absl::FailedPreconditionError(field);
  }

 private:
  std::vector<char> bytes_;
};

TEST(RunStep, ASourceThatChangedWhileReadFailsTheStepAfterTheBackend) {
  auto backend = Cpu();
  ChangedWhileRead resolver;
  StepEnvironment env;
  env.resolver = &resolver;
  env.seeds = [] { return uint64_t{1}; };
  Recorder recorder;
  v1::SampleRequest request = TinyStep(16);
  request.mutable_logits()->clear_values();
  request.mutable_logits()->set_dtype(v1::FLOAT32);
  request.mutable_logits()->mutable_buffer()->set_name("pool");
  auto result = RunStep(request, *backend, env, &recorder);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "logits.buffer: changed while read");
  EXPECT_EQ(recorder.events.back(), "after");  // the backend ran first
}

}  // namespace
}  // namespace samplerd
