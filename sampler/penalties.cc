#include "sampler/penalties.h"

#include <algorithm>

namespace samplerd {

std::vector<PenaltyTerm> PenaltyTerms(absl::Span<const int32_t> prompt,
                                      absl::Span<const int32_t> output,
                                      absl::Span<const int32_t> extra) {
  // (token, 1) for each output occurrence, (token, 0) for each prompt one; sorted and merged.
  std::vector<PenaltyTerm> all;
  all.reserve(prompt.size() + output.size() + extra.size());
  for (int32_t t : prompt) all.push_back({t, 0});
  for (int32_t t : output) all.push_back({t, 1});
  for (int32_t t : extra) all.push_back({t, 1});
  std::sort(all.begin(), all.end(),
            [](const PenaltyTerm& a, const PenaltyTerm& b) { return a.token < b.token; });
  std::vector<PenaltyTerm> out;
  for (const PenaltyTerm& term : all) {
    if (!out.empty() && out.back().token == term.token) {
      out.back().count += term.count;
    } else {
      out.push_back(term);
    }
  }
  return out;
}

}  // namespace samplerd
