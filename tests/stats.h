// Statistics for the sampler's distributional tests: chi-square and Kolmogorov-Smirnov p-values.
//
//   double p = ChiSquarePValue(counts, expected_probabilities);
//   double q = KsUniformPValue(samples);  // samples in [0, 1]
#ifndef SAMPLERD_TESTS_STATS_H_
#define SAMPLERD_TESTS_STATS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace samplerd {

// Regularised upper incomplete gamma Q(a, x) (series for x < a + 1, else continued fraction).
inline double UpperIncompleteGammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-15) break;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  double b = x + 1.0 - a, c = 1e300, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

// Pearson's chi-square goodness of fit of `counts` to `probs` (which sum to 1). Cells whose
// expected count is under 5 are pooled into one. Returns the p-value; a count in a cell of
// probability 0 gives 0.
inline double ChiSquarePValue(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                              int* degrees_of_freedom = nullptr) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  double stat = 0.0;
  int cells = 0;
  double pooled_expected = 0.0;
  int64_t pooled_count = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probs[i] * static_cast<double>(n);
    if (probs[i] == 0.0) {
      if (counts[i] != 0) return 0.0;
      continue;
    }
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_count += counts[i];
      continue;
    }
    stat += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++cells;
  }
  if (pooled_expected > 0.0) {
    stat += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) / pooled_expected;
    ++cells;
  }
  const int df = std::max(1, cells - 1);
  if (degrees_of_freedom != nullptr) *degrees_of_freedom = df;
  return UpperIncompleteGammaQ(df / 2.0, stat / 2.0);
}

// One-sample Kolmogorov-Smirnov test of `samples` against Uniform(0, 1): the asymptotic
// Kolmogorov distribution with Stephens' small-sample correction. Returns the p-value.
inline double KsUniformPValue(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const double n = static_cast<double>(samples.size());
  double d = 0.0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const double x = std::clamp(samples[i], 0.0, 1.0);
    d = std::max({d, (i + 1) / n - x, x - i / n});
  }
  const double t = (std::sqrt(n) + 0.12 + 0.11 / std::sqrt(n)) * d;
  double p = 0.0;
  for (int k = 1; k < 200; ++k) {
    const double term = 2.0 * ((k % 2) ? 1.0 : -1.0) * std::exp(-2.0 * k * k * t * t);
    p += term;
    if (std::fabs(term) < 1e-16) break;
  }
  return std::clamp(p, 0.0, 1.0);
}

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_STATS_H_
