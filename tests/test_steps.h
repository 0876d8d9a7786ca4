// Steps that the end-to-end tests send: small, seeded, inline.
//
//   v1::SampleRequest step = SmallStep(/*step_id=*/1, /*n=*/3);
#ifndef SAMPLERD_TESTS_TEST_STEPS_H_
#define SAMPLERD_TESTS_TEST_STEPS_H_

#include <cmath>
#include <random>
#include <string>

#include "samplerd/v1/sampler.pb.h"

namespace samplerd {

// A PREFILL step of `n` requests over fixed seeded logits, inline.
inline v1::SampleRequest SmallStep(uint64_t step_id, int n = 3, int vocab = 64,
                                   uint64_t seed = 1) {
  v1::SampleRequest request;
  request.set_step_id(step_id);
  v1::Tensor* t = request.mutable_logits();
  t->set_rows(n);
  t->set_cols(vocab);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int i = 0; i < n * vocab; ++i) t->mutable_values()->add_values(normal(rng));
  v1::SamplerInputs* in = request.mutable_inputs();
  in->set_kind(v1::PREFILL);
  in->set_vocab_size(vocab);
  for (int i = 0; i < n; ++i) {
    v1::RequestInputs* r = in->add_requests();
    r->set_request_id("r" + std::to_string(i));
    r->set_row(i);
    r->set_sample_position(static_cast<int64_t>(step_id));
    r->mutable_params()->set_seq_seed(seed * 100 + i);
    r->mutable_params()->set_top_logprobs(2);
  }
  return request;
}

// A DECODE request's dense draft distributions: uniform over `vocab`, one row for each of its
// rows - 1 drafts (what a drafter that knows nothing sends).
inline void SetUniformDrafts(v1::RequestInputs* r, int rows, int vocab) {
  v1::Tensor* q = r->mutable_draft_logprobs();
  q->set_rows(rows - 1);
  q->set_cols(vocab);
  for (int i = 0; i < (rows - 1) * vocab; ++i) {
    q->mutable_values()->add_values(-std::log(static_cast<float>(vocab)));
  }
}

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_TEST_STEPS_H_
