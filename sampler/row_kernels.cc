#include "sampler/row_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace samplerd {
namespace {

// Function multi-versioning: one AVX2+FMA clone and the x86-64 baseline, picked at load time.
// Not under ThreadSanitizer: the clones' ifunc resolvers run during relocation, before TSan's
// runtime exists, and its instrumentation of them crashes the process at start-up. (The two
// clones give the same bits, so the sanitizer build loses no coverage of results.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define SAMPLERD_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SAMPLERD_VECTOR_CLONES
#endif

constexpr int kLanes = 8;

// exp(x) for x <= 0 (the only range used: x = score - max). Cephes' expf: Cody-Waite reduction
// by ln 2 and a degree-6 polynomial on [-ln2/2, ln2/2], with plain multiplies and adds (no
// fma, so every instruction set computes the same bits), branch-free so that loops vectorise.
inline float ExpNonPositive(float x) {
  // Below this exp(x) is under FLT_MIN; the clamp also maps -inf to a finite value.
  const bool underflow = !(x > -87.0f);
  x = x > -87.0f ? x : -87.0f;
  // Round to nearest by the 1.5 * 2^23 trick (exact here: |x * log2 e| < 126).
  const float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;  // exact: 0.693359375 has 9 significant bits
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float result = p * scale;
  return underflow ? 0.0f : result;
}

}  // namespace

SAMPLERD_VECTOR_CLONES
bool HasNanOrPosInf(const float* values, int32_t n) {
  int bad = 0;
  for (int32_t i = 0; i < n; ++i) bad |= !(values[i] < std::numeric_limits<float>::infinity());
  return bad != 0;
}

SAMPLERD_VECTOR_CLONES
float RowMax(const float* values, int32_t n) {
  float lanes[kLanes];
  for (int j = 0; j < kLanes; ++j) lanes[j] = -std::numeric_limits<float>::infinity();
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] = lanes[j] < values[i + j] ? values[i + j] : lanes[j];
  }
  for (; i < n; ++i) lanes[0] = lanes[0] < values[i] ? values[i] : lanes[0];
  float best = lanes[0];
  for (int j = 1; j < kLanes; ++j) best = best < lanes[j] ? lanes[j] : best;
  return best;
}

SAMPLERD_VECTOR_CLONES
bool DivideInPlace(float* values, int32_t n, float divisor) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  int overflow = 0;
  for (int32_t i = 0; i < n; ++i) {
    const float x = values[i];
    const float y = x / divisor;
    overflow |= (std::fabs(y) == kInf) & (std::fabs(x) != kInf);
    values[i] = y;
  }
  return overflow != 0;
}

SAMPLERD_VECTOR_CLONES
double ExpShiftAndSum(const float* values, int32_t n, float shift, float* weights) {
  // Two simple loops, each of which the compiler vectorises: the exps, then a float64 sum in
  // eight fixed lanes (the order depends on n only).
  for (int32_t i = 0; i < n; ++i) weights[i] = ExpNonPositive(values[i] - shift);
  double lanes[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += static_cast<double>(weights[i + j]);
  }
  for (; i < n; ++i) lanes[0] += static_cast<double>(weights[i]);
  // Fixed pairwise combination of the lanes.
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

namespace {

// Any value of the chunk above `threshold`? (An OR of comparisons vectorises; a max does not
// without fast-math.)
SAMPLERD_VECTOR_CLONES
int AnyAbove(const float* values, int32_t n, float threshold) {
  int any = 0;
  for (int32_t i = 0; i < n; ++i) any |= values[i] > threshold;
  return any;
}

}  // namespace

void SortByScore(const float* scores, std::vector<int32_t>* ids) {
  std::sort(ids->begin(), ids->end(), ScoreOrder{scores});
}

void SelectTopK(const float* scores, int32_t n, int32_t k, std::vector<int32_t>* out) {
  out->clear();
  if (k <= 0) return;
  // A running threshold: once the buffer holds k candidates, a later token can only enter the
  // top k with a strictly larger score (an equal score has a larger id, so it ranks after).
  const size_t capacity = std::max<size_t>(4 * static_cast<size_t>(k), 1024);
  ScoreOrder order{scores};
  float threshold = -std::numeric_limits<float>::infinity();
  constexpr int32_t kChunk = 64;
  for (int32_t start = 0; start < n; start += kChunk) {
    const int32_t len = std::min(kChunk, n - start);
    if (!AnyAbove(scores + start, len, threshold)) continue;
    for (int32_t i = start; i < start + len; ++i) {
      if (scores[i] > threshold) out->push_back(i);
    }
    if (out->size() >= capacity) {
      std::nth_element(out->begin(), out->begin() + (k - 1), out->end(), order);
      out->resize(k);
      threshold = scores[(*out)[k - 1]];
      // Every kept candidate is >= threshold; entries equal to it stay (they rank first).
    }
  }
  if (out->size() > static_cast<size_t>(k)) {
    std::nth_element(out->begin(), out->begin() + (k - 1), out->end(), order);
    out->resize(k);
  }
  std::sort(out->begin(), out->end(), order);
}

}  // namespace samplerd
