#include "sampler/token_updates.h"

#include <algorithm>

namespace samplerd {
namespace {

// Whether the history (output then drafts) ends with `prefix`.
bool HistoryEndsWith(absl::Span<const int32_t> output, absl::Span<const int32_t> drafts,
                     absl::Span<const int32_t> prefix) {
  const size_t n = prefix.size();
  if (n > output.size() + drafts.size()) return false;
  for (size_t i = 0; i < n; ++i) {
    // Element i of prefix against element (len - n + i) of the concatenated history.
    const size_t at = output.size() + drafts.size() - n + i;
    const int32_t h = at < output.size() ? output[at] : drafts[at - output.size()];
    if (h != prefix[i]) return false;
  }
  return true;
}

}  // namespace

std::vector<TokenUpdate> RowTokenUpdates(const TokenAdjustments& adjustments,
                                         const PenaltySettings& penalties,
                                         absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> output,
                                         absl::Span<const int32_t> drafts_before) {
  std::vector<TokenUpdate> all;
  // Step 2b: a bad word of one token is always banned; a longer one when the history ends with
  // all of it but its last token.
  for (const std::vector<int32_t>& word : adjustments.bad_words) {
    const absl::Span<const int32_t> prefix(word.data(), word.size() - 1);
    if (HistoryEndsWith(output, drafts_before, prefix)) {
      TokenUpdate u;
      u.token = word.back();
      u.ban = true;
      all.push_back(u);
    }
  }
  // Step 2c: before min_tokens tokens of history, the stop ids are banned.
  if (static_cast<int64_t>(output.size() + drafts_before.size()) < adjustments.min_tokens) {
    for (int32_t t : adjustments.stop_token_ids) {
      TokenUpdate u;
      u.token = t;
      u.ban = true;
      all.push_back(u);
    }
  }
  // Step 2d.
  for (const auto& [t, bias] : adjustments.logit_bias) {
    TokenUpdate u;
    u.token = t;
    u.has_bias = true;
    u.bias = bias;
    all.push_back(u);
  }
  // Step 3's history: every prompt or output token (repetition), counted over the output.
  if (penalties.on()) {
    for (int32_t t : prompt) {
      TokenUpdate u;
      u.token = t;
      u.penalize = true;
      all.push_back(u);
    }
    for (absl::Span<const int32_t> part : {output, drafts_before}) {
      for (int32_t t : part) {
        TokenUpdate u;
        u.token = t;
        u.penalize = true;
        u.count = 1;
        all.push_back(u);
      }
    }
  }
  // Merged per token: a ban, a bias and a history count combine.
  std::sort(all.begin(), all.end(),
            [](const TokenUpdate& a, const TokenUpdate& b) { return a.token < b.token; });
  std::vector<TokenUpdate> out;
  for (const TokenUpdate& u : all) {
    if (out.empty() || out.back().token != u.token) {
      out.push_back(u);
      continue;
    }
    TokenUpdate& m = out.back();
    m.ban = m.ban || u.ban;
    if (u.has_bias) {
      m.has_bias = true;
      m.bias = u.bias;
    }
    m.penalize = m.penalize || u.penalize;
    m.count += u.count;
  }
  return out;
}

std::vector<int32_t> DraftsBefore(const RequestInputs& inputs, StepKind kind, int32_t row_index) {
  std::vector<int32_t> drafts;
  if (kind != StepKind::kDecode) return drafts;
  for (int32_t k = 0; k < row_index && k < static_cast<int32_t>(inputs.draft_token_ids.size()); ++k) {
    if (inputs.draft_token_ids[k] >= 0) drafts.push_back(inputs.draft_token_ids[k]);
  }
  return drafts;
}

}  // namespace samplerd
