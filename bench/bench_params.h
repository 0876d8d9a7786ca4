// The sampling parameters every samplerd benchmark uses (the issues' benchmark setting):
// T = 0.7, top_p = 0.95, top_k = 50, top-5 logprobs, over V = 129,280.
#ifndef SAMPLERD_BENCH_BENCH_PARAMS_H_
#define SAMPLERD_BENCH_BENCH_PARAMS_H_

#include <cstdint>
#include <vector>

#include "sampler/types.h"

namespace samplerd {

inline constexpr int32_t kBenchVocab = 129280;

inline SamplingParams BenchParams(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_p = 0.95f;
  p.top_k = 50;
  p.top_logprobs = 5;
  p.seq_seed = seed;
  return p;
}

// The token adjustments an OpenAI-style request may carry, for measuring their cost (issue:
// token adjustments): 64 logit-bias entries, 4 bad words (two of which `output` completes,
// so they ban a token), and min_tokens with two stop ids, active while `output` is shorter.
// `output` becomes the request's output history; `seed` spreads the entries over V.
inline void AddBenchAdjustments(SamplingParams& p, std::vector<int32_t>& output, uint64_t seed) {
  output = {static_cast<int32_t>((seed * 7 + 1) % kBenchVocab),
            static_cast<int32_t>((seed * 7 + 2) % kBenchVocab), 17, 23};
  for (int i = 0; i < 64; ++i) {
    p.logit_bias.emplace_back(static_cast<int32_t>((seed * 131 + i * 2017) % kBenchVocab),
                              static_cast<float>(i % 9) - 4.0f);
  }
  p.bad_words = {{23, 101}, {17, 23, 102}, {5000, 103}, {104}};
  p.min_tokens = 16;
  p.stop_token_ids = {2, 3};
}

// DRY's cost setting (issue 33): a 4,096-token context whose pattern recurs every 512 tokens,
// so the last token has 7 earlier matches, each as long as the cap (50): the case DRY is for,
// and near its worst. `seed` varies the tokens per request.
inline constexpr int32_t kBenchDryContext = 4096;
inline std::vector<int32_t> BenchDryContext(uint64_t seed) {
  std::vector<int32_t> context(kBenchDryContext);
  for (int32_t k = 0; k < kBenchDryContext; ++k) {
    context[k] = static_cast<int32_t>((seed * 131 + static_cast<uint64_t>(k % 512) * 2017) %
                                      kBenchVocab);
  }
  return context;
}

// text-generation-webui's suggested DRY settings, with two breakers.
inline void AddBenchDry(SamplingParams& p) {
  p.dry_multiplier = 0.8f;
  p.dry_base = 1.75f;
  p.dry_allowed_length = 2;
  p.dry_sequence_breakers = {13, 198};
}

}  // namespace samplerd

#endif  // SAMPLERD_BENCH_BENCH_PARAMS_H_
