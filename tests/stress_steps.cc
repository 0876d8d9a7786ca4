#include "tests/stress_steps.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "sampler/dtype.h"

namespace samplerd {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Appends `values` to `tensor` as `dtype` bytes (inline `data`).
void SetData(v1::Tensor* tensor, v1::DType dtype, const std::vector<float>& values) {
  tensor->set_dtype(dtype);
  std::string* data = tensor->mutable_data();
  if (dtype == v1::FLOAT32) {
    data->resize(values.size() * 4);
    std::memcpy(data->data(), values.data(), data->size());
    return;
  }
  data->resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits =
        dtype == v1::BFLOAT16 ? FloatToBFloat16(values[i]) : FloatToHalf(values[i]);
    std::memcpy(data->data() + 2 * i, &bits, 2);
  }
}

// The ways one request is made invalid (each must fail that request alone).
enum class Fault {
  kNone,
  kTopLogprobsNegative,
  kTopLogprobsOverLimit,
  kNegativeTemperature,
  kTopPAboveOne,
  kBiasKeyOutOfRange,
  kNaNLogit,
  kDraftIdOutOfRange,
  kBadDraftValue,
  kMaskTooShort,
  kPromptTargetOutOfRange,
  kMissingRequestId,
  kCount,
};

}  // namespace

struct StressStepGenerator::Shape {
  int32_t vocab;
  int32_t cols;        // >= vocab: padding columns beyond it
  int64_t row_stride;  // >= cols
  v1::DType dtype;
  int32_t force_top_n;
  bool sum_smaller;
  int32_t max_rows;    // what max_elements allows
};

void StressStepGenerator::FillParams(v1::SamplingParams* p, int32_t vocab) {
  p->set_seq_seed(rng_());
  if (Chance(0.1)) {
    p->set_temperature(0.0f);
  } else if (Chance(0.7)) {
    p->set_temperature(std::uniform_real_distribution<float>(0.2f, 2.0f)(rng_));
  }
  if (Chance(0.4)) p->set_top_p(std::uniform_real_distribution<float>(0.3f, 1.0f)(rng_));
  if (Chance(0.45)) {
    const double which = std::uniform_real_distribution<double>(0, 1)(rng_);
    p->set_top_k(which < 0.55 ? Uniform(1, 64) : which < 0.8 ? Uniform(65, 500) : Uniform(1, 5));
  }
  if (Chance(0.25)) p->set_min_p(std::uniform_real_distribution<float>(0.0f, 0.3f)(rng_));
  if (Chance(0.5)) p->set_top_logprobs(Chance(0.1) ? Uniform(20, 64) : Uniform(0, 8));
  if (Chance(0.2)) {
    p->set_repetition_penalty(std::uniform_real_distribution<float>(0.8f, 1.5f)(rng_));
    p->set_presence_penalty(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng_));
    p->set_frequency_penalty(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng_));
  }
  if (Chance(0.2)) {
    const int biases = Uniform(0, 4);
    for (int i = 0; i < biases; ++i) {
      (*p->mutable_logit_bias())[Token(vocab)] = std::uniform_real_distribution<float>(-100, 100)(rng_);
    }
    const int words = Uniform(0, 2);
    for (int i = 0; i < words; ++i) {
      v1::TokenSequence* word = p->add_bad_words();
      const int length = Uniform(1, 2);
      for (int k = 0; k < length; ++k) word->add_token_ids(Token(vocab));
    }
    if (Chance(0.3)) {
      const int allowed = Uniform(1, std::min(vocab, 50));
      for (int i = 0; i < allowed; ++i) p->add_allowed_token_ids(Token(vocab));
    }
    if (Chance(0.5)) {
      p->set_min_tokens(Uniform(1, 4));
      const int stops = Uniform(1, 2);
      for (int i = 0; i < stops; ++i) p->add_stop_token_ids(Token(vocab));
    }
  }
}

std::string StressStepGenerator::Mask(int32_t vocab) {
  std::string mask(4 * ((static_cast<size_t>(vocab) + 31) / 32), '\0');
  // Dense or sparse: most tokens allowed, or a handful.
  const double keep = Chance(0.5) ? 0.8 : 0.02;
  bool any = false;
  for (int32_t t = 0; t < vocab; ++t) {
    if (Chance(keep)) {
      mask[t / 8] = static_cast<char>(mask[t / 8] | (1 << (t % 8)));
      any = true;
    }
  }
  if (!any) mask[0] = 1;  // token 0 at least
  return mask;
}

void StressStepGenerator::FillLogits(v1::Tensor* tensor, const Shape& shape, int32_t rows) {
  tensor->set_rows(rows);
  tensor->set_cols(shape.cols);
  if (shape.row_stride != shape.cols) tensor->set_row_stride(shape.row_stride);
  const float scale = std::vector<float>{1.0f, 3.0f, 8.0f}[rng_() % 3];
  const bool ties = Chance(0.15);    // values on a 0.5 grid: many equal scores
  const bool minus_inf = Chance(0.1);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(static_cast<size_t>((rows - 1) * shape.row_stride + shape.cols));
  for (int32_t r = 0; r < rows; ++r) {
    float* row = values.data() + static_cast<size_t>(r) * shape.row_stride;
    for (int32_t c = 0; c < shape.vocab; ++c) {
      float v = normal(rng_);
      if (ties) v = std::round(v * 2.0f) / 2.0f;
      if (minus_inf && c % 7 == 3) v = -kInf;
      row[c] = v;
    }
    // Padding is never read as logits: garbage, NaN included.
    for (int32_t c = shape.vocab; c < shape.cols; ++c) row[c] = (c % 2 == 0) ? kNaN : 1e30f;
  }
  SetData(tensor, shape.dtype, values);
}

void StressStepGenerator::FillDenseDrafts(v1::Tensor* tensor, int32_t rows, int32_t vocab,
                                          int32_t cols) {
  // Draft logprobs: a log-softmax of random logits over the vocabulary (float64), -inf where
  // the draft masks, garbage in padding columns.
  std::vector<float> values(static_cast<size_t>(rows) * cols);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::vector<double> logits(vocab);
  for (int32_t r = 0; r < rows; ++r) {
    double max = -1e300;
    for (int32_t t = 0; t < vocab; ++t) max = std::max(max, logits[t] = normal(rng_));
    double sum = 0.0;
    for (int32_t t = 0; t < vocab; ++t) sum += std::exp(logits[t] - max);
    float* row = values.data() + static_cast<size_t>(r) * cols;
    for (int32_t t = 0; t < vocab; ++t) {
      row[t] = (t % 11 == 5) ? -kInf : static_cast<float>(logits[t] - max - std::log(sum));
    }
    for (int32_t c = vocab; c < cols; ++c) row[c] = kNaN;
  }
  tensor->set_rows(rows);
  tensor->set_cols(cols);
  SetData(tensor, Chance(0.8) ? v1::FLOAT32 : v1::BFLOAT16, values);
}

v1::SampleRequest StressStepGenerator::Step(v1::StepKind kind, const Shape& shape, int requests,
                                            std::vector<std::string>* pool_ids,
                                            bool verify_pool) {
  const int32_t V = shape.vocab;
  v1::SampleRequest step;
  step.set_step_id(next_step_id_++);
  v1::SamplerInputs* inputs = step.mutable_inputs();
  inputs->set_kind(kind);
  inputs->set_vocab_size(V);
  inputs->set_force_top_n(shape.force_top_n);
  inputs->set_compute_sum_smaller_probs(shape.sum_smaller);
  int32_t rows = 0;  // the row cursor: each request claims rows of its own
  std::vector<std::pair<int32_t, int32_t>> poison;  // (row, column) that get a NaN logit
  std::vector<std::string> pooled = verify_pool ? *pool_ids : std::vector<std::string>{};
  if (kind == v1::DRAFT) pool_ids->clear();
  for (int i = 0; i < requests; ++i) {
    v1::RequestInputs* r = inputs->add_requests();
    const bool use_pool = kind == v1::DECODE && !pooled.empty() && Chance(0.6);
    r->set_request_id(use_pool ? pooled.back() : absl::StrCat("req-", next_request_++));
    if (use_pool) pooled.pop_back();
    FillParams(r->mutable_params(), V);
    r->set_sample_position(static_cast<int64_t>(rng_() % 1000000));
    const int history = Uniform(0, 6);
    for (int k = 0; k < history; ++k) r->add_prompt_token_ids(Token(V));
    for (int k = 0; k < history / 2; ++k) r->add_output_token_ids(Token(V));
    int sampled = 1;
    switch (kind) {
      case v1::PREFILL: {
        r->set_row(rows++);
        if (Chance(0.25)) {
          const int targets = Uniform(1, 3);
          r->set_prompt_first_row(rows);
          for (int k = 0; k < targets; ++k) r->add_prompt_targets(Token(V));
          rows += targets;
        }
        if (Chance(0.1)) r->add_golden_token_ids(Token(V));
        break;
      }
      case v1::DECODE: {
        // A pooled request verifies the drafts its DRAFT step stored (now and then one more,
        // which the pool does not hold).
        const int q = use_pool ? pool_drafts_[r->request_id()] + (Chance(0.9) ? 1 : 2)
                               : Uniform(1, 4);
        sampled = q;
        r->set_first_row(rows);
        r->set_num_rows(q);
        rows += q;
        for (int k = 0; k + 1 < q; ++k) r->add_draft_token_ids(Chance(0.1) ? -1 : Token(V));
        if (q > 1 && !use_pool) {
          if (Chance(0.5)) {
            FillDenseDrafts(r->mutable_draft_logprobs(), q - 1, V, V + Uniform(0, 3));
          } else {
            v1::DraftTopN* topn = r->mutable_draft_topn();
            const int n = Uniform(1, std::min(V, 8));
            std::vector<float> values;
            for (int k = 0; k + 1 < q; ++k) {
              for (int m = 0; m < n; ++m) {
                topn->add_token_ids(Chance(0.05) ? -1 : Token(V));
                values.push_back(-0.3f * static_cast<float>(m + 1) - 0.1f * Uniform(0, 5));
              }
            }
            topn->mutable_values()->set_rows(q - 1);
            topn->mutable_values()->set_cols(n);
            SetData(topn->mutable_values(), v1::FLOAT32, values);
          }
        }
        if (Chance(0.1)) {
          for (int k = 0; k < q; ++k) r->add_golden_token_ids(Chance(0.5) ? -1 : Token(V));
        }
        break;
      }
      case v1::DRAFT: {
        const int n = Uniform(1, 3);
        sampled = n;
        for (int k = 0; k < n; ++k) {
          r->add_rows(rows++);
          r->add_draft_indices(k + 1);
        }
        r->set_last_valid_offset(Uniform(0, 2));
        pool_ids->push_back(r->request_id());
        pool_drafts_[r->request_id()] = n;
        break;
      }
      default:
        break;
    }
    if (Chance(0.15)) {
      for (int k = 0; k < sampled; ++k) r->add_allowed_token_masks(Chance(0.2) ? "" : Mask(V));
    }

    if (!Chance(options_.invalid_request)) continue;
    const auto fault = static_cast<Fault>(Uniform(1, static_cast<int>(Fault::kCount) - 1));
    v1::SamplingParams* p = r->mutable_params();
    switch (fault) {
      case Fault::kTopLogprobsNegative: p->set_top_logprobs(-1); break;
      case Fault::kTopLogprobsOverLimit: p->set_top_logprobs(65); break;
      case Fault::kNegativeTemperature: p->set_temperature(-0.5f); break;
      case Fault::kTopPAboveOne: p->set_top_p(1.5f); break;
      case Fault::kBiasKeyOutOfRange: (*p->mutable_logit_bias())[V] = 1.0f; break;
      case Fault::kNaNLogit: {
        const int32_t row = kind == v1::PREFILL ? r->row()
                            : kind == v1::DECODE ? r->first_row() + Uniform(0, r->num_rows() - 1)
                                                 : r->rows(0);
        poison.emplace_back(row, Token(V));
        break;
      }
      case Fault::kDraftIdOutOfRange:
        if (r->draft_token_ids_size() > 0) r->set_draft_token_ids(0, V);
        else p->set_top_logprobs(-1);
        break;
      case Fault::kBadDraftValue:
        if (r->has_draft_topn()) {
          v1::Tensor* values = r->mutable_draft_topn()->mutable_values();
          const float inf = kInf;
          std::memcpy(values->mutable_data()->data(), &inf, 4);
        } else if (r->has_draft_logprobs()) {
          // A NaN in the last real column of the last row: never read unless that token is
          // kept, yet an error (SPEC 6).
          v1::Tensor* t = r->mutable_draft_logprobs();
          const size_t at = static_cast<size_t>(t->rows() - 1) * t->cols() + (V - 1);
          if (t->dtype() == v1::FLOAT32) {
            std::memcpy(t->mutable_data()->data() + 4 * at, &kNaN, 4);
          } else {
            const uint16_t nan_bits = 0x7FC0;
            std::memcpy(t->mutable_data()->data() + 2 * at, &nan_bits, 2);
          }
        } else {
          p->set_top_p(0.0f);
        }
        break;
      case Fault::kMaskTooShort:
        r->clear_allowed_token_masks();
        for (int k = 0; k < sampled; ++k) r->add_allowed_token_masks(std::string(2, '\xff'));
        break;
      case Fault::kPromptTargetOutOfRange:
        if (r->prompt_targets_size() > 0) r->set_prompt_targets(0, V + 1);
        else r->add_prompt_token_ids(-2);
        break;
      case Fault::kMissingRequestId:
        if (kind == v1::DRAFT) {
          pool_ids->pop_back();
          r->clear_request_id();
        } else {
          r->add_output_token_ids(V);
        }
        break;
      default:
        break;
    }
  }
  rows += Uniform(0, 2);  // rows no request reads
  if (Chance(options_.invalid_step) && inputs->requests_size() >= 2 &&
      inputs->requests(0).rows_size() == 0 && inputs->requests(1).rows_size() == 0) {
    // Two requests read the same row: the step fails as a whole.
    v1::RequestInputs* r1 = inputs->mutable_requests(1);
    if (kind == v1::PREFILL) r1->set_row(inputs->requests(0).row());
    if (kind == v1::DECODE) r1->set_first_row(inputs->requests(0).first_row());
  }
  FillLogits(step.mutable_logits(), shape, rows);
  for (const auto& [row, col] : poison) {
    const size_t at = static_cast<size_t>(row) * shape.row_stride + col;
    v1::Tensor* t = step.mutable_logits();
    if (shape.dtype == v1::FLOAT32) {
      std::memcpy(t->mutable_data()->data() + 4 * at, &kNaN, 4);
    } else {
      const uint16_t nan_bits = 0x7E00;  // a NaN in fp16 and in bf16
      std::memcpy(t->mutable_data()->data() + 2 * at, &nan_bits, 2);
    }
  }
  return step;
}

StressScenario StressStepGenerator::Next() {
  Shape shape;
  // Vocabularies: mostly small, some of LLM size, a few past the fused path's reach.
  do {
    const double which = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (which < 0.45) {
      shape.vocab = Uniform(2, 600);
    } else if (which < 0.75) {
      shape.vocab = Uniform(600, 40000);
    } else if (which < 0.93) {
      shape.vocab = Uniform(40000, 160000);
    } else {
      shape.vocab = Uniform(160000, options_.max_vocab);
    }
    shape.cols = shape.vocab + (Chance(0.4) ? Uniform(1, 7) : 0);
    shape.row_stride = shape.cols + (Chance(0.2) ? Uniform(1, 5) : 0);
    shape.max_rows = static_cast<int32_t>(
        std::min<int64_t>(64, options_.max_elements / shape.row_stride));
  } while (shape.max_rows < 5);  // one request of the most rows one may claim
  const double dtype = std::uniform_real_distribution<double>(0, 1)(rng_);
  shape.dtype = dtype < 0.7 ? v1::FLOAT32 : dtype < 0.85 ? v1::BFLOAT16 : v1::FLOAT16;
  shape.force_top_n = Chance(0.15) ? Uniform(1, std::min(shape.vocab, 64)) : 0;
  shape.sum_smaller = Chance(0.5);
  // Requests so that the rows fit: a request claims at most 4 rows (DECODE q, PREFILL with
  // prompt targets).
  const int max_requests = std::max(1, std::min(6, shape.max_rows / 7));
  StressScenario scenario;
  std::vector<std::string> pool_ids;
  const double kind = std::uniform_real_distribution<double>(0, 1)(rng_);
  if (kind < 0.4) {
    scenario.steps.push_back(Step(v1::PREFILL, shape, Uniform(1, max_requests), &pool_ids, false));
  } else if (kind < 0.7) {
    scenario.steps.push_back(Step(v1::DECODE, shape, Uniform(1, max_requests), &pool_ids, false));
  } else {
    // A DRAFT step, then the DECODE step that verifies its pooled drafts beside other requests.
    scenario.steps.push_back(Step(v1::DRAFT, shape, Uniform(1, max_requests), &pool_ids, false));
    scenario.pooled_ids = pool_ids;
    scenario.steps.push_back(Step(v1::DECODE, shape, Uniform(1, max_requests), &pool_ids, true));
  }
  scenario.what = absl::StrCat("V ", shape.vocab, " cols ", shape.cols, " stride ",
                               shape.row_stride, " ", v1::DType_Name(shape.dtype),
                               " force_top_n ", shape.force_top_n, ", steps ",
                               scenario.steps.size(), " (first ",
                               v1::StepKind_Name(scenario.steps[0].inputs().kind()), ")");
  return scenario;
}

}  // namespace samplerd
