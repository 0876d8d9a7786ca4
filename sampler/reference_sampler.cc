#include "sampler/reference_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

namespace samplerd {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

ReferenceRow ReferenceProcess(const std::vector<float>& raw, const NormalizedParams& params,
                              const ReferenceOptions& options) {
  ReferenceRow out;
  const int32_t V = options.vocab_size;
  std::vector<double> x(V);
  for (int32_t t = 0; t < V; ++t) {
    if (std::isnan(raw[t]) || raw[t] == std::numeric_limits<float>::infinity()) return out;
    x[t] = raw[t];
  }
  {
    const double m = *std::max_element(x.begin(), x.end());
    double z = 0.0;
    for (int32_t t = 0; t < V; ++t) z += std::exp(x[t] - m);
    out.raw_logprobs.resize(V);
    for (int32_t t = 0; t < V; ++t) out.raw_logprobs[t] = x[t] - m - std::log(z);
  }
  if (!options.prompt_mode) {
    if (options.mask != nullptr) {
      for (int32_t t = 0; t < V; ++t) {
        const uint32_t word = static_cast<uint32_t>(options.mask[4 * (t / 32)]) |
                              static_cast<uint32_t>(options.mask[4 * (t / 32) + 1]) << 8 |
                              static_cast<uint32_t>(options.mask[4 * (t / 32) + 2]) << 16 |
                              static_cast<uint32_t>(options.mask[4 * (t / 32) + 3]) << 24;
        if (((word >> (t % 32)) & 1u) == 0) x[t] = -kInf;
      }
    }
    // Token adjustments (SPEC 3 step 2a-d), in float32 as the contract's arithmetic.
    if (options.sent != nullptr) {
      const SamplingParams& sent = *options.sent;
      if (!sent.allowed_token_ids.empty()) {
        const std::set<int32_t> allowed(sent.allowed_token_ids.begin(),
                                        sent.allowed_token_ids.end());
        for (int32_t t = 0; t < V; ++t) {
          if (allowed.count(t) == 0) x[t] = -kInf;
        }
      }
      const std::vector<int32_t>& history = options.output_tokens;
      for (const std::vector<int32_t>& word : sent.bad_words) {
        const size_t n = word.size() - 1;  // the prefix the history must end with
        bool ends = history.size() >= n;
        for (size_t i = 0; ends && i < n; ++i) ends = history[history.size() - n + i] == word[i];
        if (ends) x[word.back()] = -kInf;
      }
      if (static_cast<int64_t>(history.size()) < sent.min_tokens) {
        for (int32_t t : sent.stop_token_ids) x[t] = -kInf;
      }
      for (const auto& [t, bias] : sent.logit_bias) {
        if (x[t] == -kInf) continue;
        const float v = static_cast<float>(x[t]) + bias;
        if (std::isinf(v)) return out;  // left the float32 range
        x[t] = v;
      }
    }
    // Penalties, in float32 as the contract's arithmetic on raw logits.
    std::set<int32_t> seen(options.prompt_tokens.begin(), options.prompt_tokens.end());
    std::map<int32_t, int> counts;
    for (int32_t t : options.output_tokens) {
      seen.insert(t);
      ++counts[t];
    }
    if (params.repetition_penalty != 1.0f) {
      for (int32_t t : seen) {
        const float v = static_cast<float>(x[t]);
        x[t] = v > 0.0f ? v / params.repetition_penalty : v * params.repetition_penalty;
      }
    }
    for (const auto& [t, c] : counts) {
      const float v = static_cast<float>(x[t]);
      x[t] = v - (params.presence_penalty + params.frequency_penalty * static_cast<float>(c));
    }
    if (options.force_top_n > 0 && options.force_top_n < V) {
      std::vector<int32_t> ids(V);
      std::iota(ids.begin(), ids.end(), 0);
      std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
      for (int32_t r = options.force_top_n; r < V; ++r) x[ids[r]] = -kInf;
    }
    if (params.top_n_sigma > 0.0f) {
      // Top-nσ over the finite values (population sigma), float64.
      double m = -kInf, sum = 0.0;
      int64_t n = 0;
      for (int32_t t = 0; t < V; ++t) {
        if (x[t] == -kInf) continue;
        m = std::max(m, x[t]);
        sum += x[t];
        ++n;
      }
      if (n > 0) {
        const double mean = sum / n;
        double var = 0.0;
        for (int32_t t = 0; t < V; ++t) {
          if (x[t] != -kInf) var += (x[t] - mean) * (x[t] - mean);
        }
        const double bound = m - params.top_n_sigma * std::sqrt(var / n);
        for (int32_t t = 0; t < V; ++t) {
          if (x[t] == -kInf) continue;
          out.sigma_margin =
              std::min(out.sigma_margin, std::fabs(x[t] - bound) / std::max(1.0, std::fabs(m)));
          if (x[t] < bound) x[t] = -kInf;
        }
      }
    }
  }
  // Temperature: the contract divides float32 logits by a float32 temperature.
  for (int32_t t = 0; t < V; ++t) {
    if (x[t] != -kInf) x[t] = static_cast<float>(x[t]) / params.temperature;
  }
  const double max = *std::max_element(x.begin(), x.end());
  if (max == -kInf) return out;
  std::vector<double> p(V);
  double z = 0.0;
  for (int32_t t = 0; t < V; ++t) z += std::exp(x[t] - max);
  for (int32_t t = 0; t < V; ++t) p[t] = std::exp(x[t] - max) / z;
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  std::vector<bool> keep(V);
  for (int32_t t = 0; t < V; ++t) keep[t] = x[t] != -kInf;
  if (params.top_p < 1.0f) {
    double before = 0.0;
    for (int32_t r = 0; r < V; ++r) {
      out.top_p_margin = std::min(out.top_p_margin, std::fabs(before - params.top_p));
      if (before > params.top_p) keep[ids[r]] = false;
      before += p[ids[r]];
    }
  }
  if (params.top_k > 0) {
    int32_t rank = 0;
    for (int32_t r = 0; r < V; ++r) {
      if (!keep[ids[r]]) continue;
      if (rank >= params.top_k) keep[ids[r]] = false;
      ++rank;
    }
  }
  if (!options.prompt_mode && params.min_p > 0.0f) {
    double kept_max = 0.0;
    for (int32_t t = 0; t < V; ++t) {
      if (keep[t]) kept_max = std::max(kept_max, p[t]);
    }
    for (int32_t t = 0; t < V; ++t) {
      if (keep[t] && p[t] < params.min_p * kept_max) keep[t] = false;
    }
  }
  double kept_z = 0.0;
  for (int32_t t = 0; t < V; ++t) {
    if (keep[t]) kept_z += std::exp(x[t] - max);
  }
  if (!options.prompt_mode && options.xtc_u < params.xtc_probability) {
    // XTC: the kept tokens with p >= threshold, in the draw's order; all but the last go.
    std::vector<int32_t> top;
    for (int32_t r = 0; r < V; ++r) {
      const int32_t t = ids[r];
      if (!keep[t]) continue;
      const double pk = std::exp(x[t] - max) / kept_z;
      out.xtc_margin = std::min(out.xtc_margin, std::fabs(pk - params.xtc_threshold));
      if (pk >= params.xtc_threshold) top.push_back(t);
    }
    if (top.size() >= 2) {
      for (size_t i = 0; i + 1 < top.size(); ++i) keep[top[i]] = false;
      kept_z = 0.0;
      for (int32_t t = 0; t < V; ++t) {
        if (keep[t]) kept_z += std::exp(x[t] - max);
      }
    }
  }
  out.logprobs.assign(V, -kInf);
  out.probs.assign(V, 0.0);
  for (int32_t t = 0; t < V; ++t) {
    if (!keep[t]) continue;
    out.logprobs[t] = (x[t] - max) - std::log(kept_z);
    out.probs[t] = std::exp(out.logprobs[t]);
  }
  for (int32_t r = 0; r < V; ++r) {
    if (keep[ids[r]]) out.order.push_back(ids[r]);
  }
  out.ok = !out.order.empty();
  return out;
}

int32_t ReferenceDraw(const ReferenceRow& row, double u, double* edge_distance) {
  double sum = 0.0;
  for (int32_t t : row.order) sum += row.probs[t];
  const double target = u * sum;
  double cumulative = 0.0;
  double nearest = kInf;
  int32_t chosen = -1;
  for (int32_t t : row.order) {
    nearest = std::min(nearest, std::fabs(cumulative - target) / sum);
    cumulative += row.probs[t];
    if (chosen < 0 && cumulative > target) chosen = t;
  }
  nearest = std::min(nearest, std::fabs(cumulative - target) / sum);
  if (edge_distance != nullptr) *edge_distance = nearest;
  return chosen >= 0 ? chosen : row.order.back();
}

std::vector<std::pair<int32_t, double>> ReferenceTop(const ReferenceRow& row, int32_t n) {
  std::vector<std::pair<int32_t, double>> out(n, {-1, -kInf});
  for (int32_t i = 0; i < n && i < static_cast<int32_t>(row.order.size()); ++i) {
    out[i] = {row.order[i], row.logprobs[row.order[i]]};
  }
  return out;
}

std::vector<std::pair<int32_t, double>> ReferenceRawTop(const ReferenceRow& row, int32_t n) {
  std::vector<int32_t> ids(row.raw_logprobs.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return row.raw_logprobs[a] > row.raw_logprobs[b];
  });
  std::vector<std::pair<int32_t, double>> out(n, {-1, -kInf});
  for (int32_t i = 0; i < n && i < static_cast<int32_t>(ids.size()); ++i) {
    if (row.raw_logprobs[ids[i]] == -kInf) break;
    out[i] = {ids[i], row.raw_logprobs[ids[i]]};
  }
  return out;
}

double ReferenceSumSmaller(const ReferenceRow& row, int32_t token) {
  const double pivot = row.logprobs[token];
  if (pivot == -kInf) return 0.0;
  double sum = 0.0;
  for (int32_t x = 0; x < static_cast<int32_t>(row.logprobs.size()); ++x) {
    const double v = row.logprobs[x];
    if (v == -kInf) continue;
    if (v < pivot || (v == pivot && x <= token)) sum += row.probs[x];
  }
  return sum;
}

}  // namespace samplerd
