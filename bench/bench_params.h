// The sampling parameters every samplerd benchmark uses (the issues' benchmark setting):
// T = 0.7, top_p = 0.95, top_k = 50, top-5 logprobs, over V = 129,280.
#ifndef SAMPLERD_BENCH_BENCH_PARAMS_H_
#define SAMPLERD_BENCH_BENCH_PARAMS_H_

#include <cstdint>

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

}  // namespace samplerd

#endif  // SAMPLERD_BENCH_BENCH_PARAMS_H_
