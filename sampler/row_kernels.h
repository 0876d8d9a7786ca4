// Vectorised per-row loops of the CPU backend: the passes over a full vocabulary row.
//
// Each function does one pass in a fixed order that depends only on the row's length, never
// on the batch, so results are bitwise reproducible and batch invariant. They are compiled for
// AVX2+FMA and for baseline x86-64, and the loader picks the one the processor runs.
//
//   float max = RowMax(scores, n);
//   double sum = ExpShiftAndSum(scores, n, max, weights);
#ifndef SAMPLERD_SAMPLER_ROW_KERNELS_H_
#define SAMPLERD_SAMPLER_ROW_KERNELS_H_

#include <cstdint>
#include <vector>

namespace samplerd {

// True when some value is NaN or +inf.
bool HasNanOrPosInf(const float* values, int32_t n);

// Largest value (-inf for an empty or all -inf row). NaN must have been excluded.
float RowMax(const float* values, int32_t n);

// values[i] /= divisor, in place (IEEE division, as the CUDA backend does). Returns true when
// a finite value left the float32 range (became +-inf): SPEC 3 makes that a row error.
bool DivideInPlace(float* values, int32_t n, float divisor);

// weights[i] = exp(values[i] - shift) (0 for -inf), and returns their sum in float64,
// accumulated in eight fixed lanes. exp is a polynomial within 2 ulp of expf.
double ExpShiftAndSum(const float* values, int32_t n, float shift, float* weights);

// The k best token ids of `scores` (descending score, ties by lower id), finite scores only,
// sorted best first, into `out` (fewer than k if fewer are finite). `scratch` is reused.
void SelectTopK(const float* scores, int32_t n, int32_t k, std::vector<int32_t>* out);

// Token a before token b in the order of SPEC sections 3 and 5: descending score, ties by
// lower id.
struct ScoreOrder {
  const float* scores;
  bool operator()(int32_t a, int32_t b) const {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  }
};

// Sorts ids by ScoreOrder.
void SortByScore(const float* scores, std::vector<int32_t>* ids);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_ROW_KERNELS_H_
