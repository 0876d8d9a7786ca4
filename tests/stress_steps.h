// Random steps of mixed shapes for the stress test (issue 25): every kind (PREFILL with prompt
// logprobs, DECODE with dense, top-N and pooled drafts, DRAFT), vocabularies from 2 to 400,000
// with padding columns, fp32 / bf16 / fp16 logits, force top-N, grammar masks, token
// adjustments and penalties, golden tokens, and invalid requests mixed in among valid ones
// (each invalid request carries one fault that must fail it alone), now and then a step whose
// fault fails it as a whole. All inline: a scenario is what one model worker sends in order on
// its own connection (a DRAFT step and the DECODE step that verifies its pooled drafts).
//
//   StressStepGenerator generator(/*seed=*/7, StressOptions{});
//   StressScenario scenario = generator.Next();
//   for (const v1::SampleRequest& step : scenario.steps) { ... send, compare ... }
#ifndef SAMPLERD_TESTS_STRESS_STEPS_H_
#define SAMPLERD_TESTS_STRESS_STEPS_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "samplerd/v1/sampler.pb.h"

namespace samplerd {

struct StressOptions {
  // Logits elements (rows x cols) of one step at most: bounds a step's cost on the CPU
  // reference. A vocabulary too wide for even one row at this bound is drawn again.
  int64_t max_elements = int64_t{1} << 21;
  int32_t max_vocab = 400000;
  // Probability that a request carries one fault of its own, and that a step is malformed.
  double invalid_request = 0.15;
  double invalid_step = 0.03;
};

struct StressScenario {
  std::vector<v1::SampleRequest> steps;
  // Request ids whose pool entries may be left after the scenario (a DECODE request that failed
  // before it took them): the sender releases them, so the pool never fills across scenarios.
  std::vector<std::string> pooled_ids;
  std::string what;  // kinds, vocabulary, dtype: for failure messages
};

class StressStepGenerator {
 public:
  StressStepGenerator(uint64_t seed, const StressOptions& options)
      : rng_(seed), options_(options) {}
  StressScenario Next();

 private:
  struct Shape;
  v1::SampleRequest Step(v1::StepKind kind, const Shape& shape, int requests,
                         std::vector<std::string>* pool_ids, bool verify_pool);
  void FillParams(v1::SamplingParams* params, int32_t vocab);
  void FillLogits(v1::Tensor* tensor, const Shape& shape, int32_t rows);
  void FillDenseDrafts(v1::Tensor* tensor, int32_t rows, int32_t vocab, int32_t cols);
  std::string Mask(int32_t vocab);
  int32_t Token(int32_t vocab) { return static_cast<int32_t>(rng_() % vocab); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::mt19937_64 rng_;
  const StressOptions options_;
  uint64_t next_step_id_ = 1;
  uint64_t next_request_ = 0;
  std::map<std::string, int> pool_drafts_;  // drafts each DRAFT request stored
};

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_STRESS_STEPS_H_
