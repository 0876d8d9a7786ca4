// Helpers for tests of the core: building steps over host vectors (testonly).
//
//   HostLogits logits(rows, cols, /*seed=*/7);
//   Step step = MakeStep(StepKind::kPrefill, logits, vocab_size);
#ifndef SAMPLERD_SAMPLER_TEST_UTIL_H_
#define SAMPLERD_SAMPLER_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sampler/dtype.h"
#include "sampler/types.h"

namespace samplerd {

// Row-major float logits owned by the test, with the view the core reads.
struct HostLogits {
  HostLogits(int32_t rows, int32_t cols) : rows(rows), cols(cols), values(rows * cols) {}
  // Normal(0, scale) logits from a fixed seed.
  HostLogits(int32_t rows, int32_t cols, uint64_t seed, float scale = 3.0f)
      : HostLogits(rows, cols) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    for (float& v : values) v = normal(rng);
  }
  float* Row(int32_t r) { return values.data() + static_cast<size_t>(r) * cols; }
  std::vector<float> RowVector(int32_t r) const {
    return std::vector<float>(values.begin() + static_cast<size_t>(r) * cols,
                              values.begin() + static_cast<size_t>(r + 1) * cols);
  }
  // Rows [first, first + count) as a view of their own.
  LogitsView RowsView(int32_t first, int32_t count) const {
    LogitsView view = View();
    view.data = values.data() + static_cast<size_t>(first) * cols;
    view.rows = count;
    return view;
  }
  LogitsView View() const {
    LogitsView view;
    view.data = values.data();
    view.dtype = DType::kFloat32;
    view.rows = rows;
    view.cols = cols;
    view.row_stride = cols;
    return view;
  }
  int32_t rows;
  int32_t cols;
  std::vector<float> values;
};

inline Step MakeStep(StepKind kind, const HostLogits& logits, int32_t vocab_size) {
  Step step;
  step.kind = kind;
  step.vocab_size = vocab_size;
  step.logits = logits.View();
  return step;
}

inline RequestInputs PrefillRequest(const std::string& id, int32_t row, uint64_t seed,
                                    int64_t sample_position = 41) {
  RequestInputs r;
  r.request_id = id;
  r.row = row;
  r.sample_position = sample_position;
  r.params.seq_seed = seed;
  return r;
}

// A DECODE request verifying rows [first_row, first_row + num_rows): its last row is the bonus
// row, so it carries num_rows - 1 drafts, which the caller adds with their distributions.
inline RequestInputs DecodeRequest(const std::string& id, int32_t first_row, int32_t num_rows,
                                   uint64_t seed, int64_t sample_position = 50) {
  RequestInputs r;
  r.request_id = id;
  r.first_row = first_row;
  r.num_rows = num_rows;
  r.sample_position = sample_position;
  r.params.seq_seed = seed;
  return r;
}

// A bitmask allowing exactly `allowed` (little-endian int32 words).
inline std::string MaskOf(int32_t vocab_size, const std::vector<int32_t>& allowed) {
  std::string mask(4 * ((vocab_size + 31) / 32), '\0');
  for (int32_t t : allowed) mask[t / 8] = static_cast<char>(mask[t / 8] | (1 << (t % 8)));
  return mask;
}

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_TEST_UTIL_H_
