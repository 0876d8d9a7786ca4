// The logits-processor seam: every per-token change SPEC 3 makes to a sampled row between its
// mask and force top-N, as one sparse list per row that each backend applies in one place
// (RowProcessor on the CPU, the row prologue on CUDA), with spec_rules.h's UpdateToken.
//
// SPEC 3 step 2a (allowed_token_ids) is a set of tokens, not a per-token value: PlanStep folds
// it into the row's mask (RequestPlan::owned_masks). Steps 2b-d (bad words, min_tokens' stop
// ids, logit bias) and step 3 (penalties) are entries here, merged per token and sorted by
// token, so a row costs what its request holds (its bias entries, its words, its history),
// never V. A new per-token adjustment is: the proto field, its conversion (server/
// proto_convert), its check (sampler/validate), and its entries in RowTokenUpdates.
//
//   std::vector<TokenUpdate> updates = RowTokenUpdates(request_plan, step.kind, row_index);
//   for (const TokenUpdate& u : updates) x[u.token] = UpdateToken(x[u.token], u.ban, ...);
#ifndef SAMPLERD_SAMPLER_TOKEN_UPDATES_H_
#define SAMPLERD_SAMPLER_TOKEN_UPDATES_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "sampler/types.h"

namespace samplerd {

// A request's token adjustments after SPEC 2's checks (validate.cc), in the form rows use.
struct TokenAdjustments {
  std::vector<std::vector<int32_t>> bad_words;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;                // sorted, unique
  std::vector<std::pair<int32_t, float>> logit_bias;  // sorted by token, unique
  bool empty() const {
    return bad_words.empty() && (min_tokens == 0 || stop_token_ids.empty()) && logit_bias.empty();
  }
};

// One token's updates in one row (UpdateToken's arguments, less the request's penalties).
struct TokenUpdate {
  int32_t token = 0;
  bool ban = false;       // -inf: a bad word it completes, or a stop id before min_tokens
  bool has_bias = false;  // logit_bias names it
  float bias = 0.0f;
  bool penalize = false;  // in the penalty history (prompt or output), penalties on
  int32_t count = 0;      // its occurrences in the output history
};

// Penalty settings of a request (NormalizedParams' three penalties).
struct PenaltySettings {
  float repetition = 1.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
  bool on() const { return repetition != 1.0f || presence != 0.0f || frequency != 0.0f; }
};

// The updates of one sampled row, sorted by token, one entry per token. `output` is the row's
// output history (SPEC 3): the request's output_token_ids, then for row j of a DECODE request
// the drafts of rows 0..j-1 that are not -1 (`drafts_before`); `prompt` counts for the
// repetition penalty only.
std::vector<TokenUpdate> RowTokenUpdates(const TokenAdjustments& adjustments,
                                         const PenaltySettings& penalties,
                                         absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> output,
                                         absl::Span<const int32_t> drafts_before);

// SPEC 3's output history of sampled row `row_index` of a request: its output_token_ids, then
// in a DECODE step the drafts of rows 0..row_index-1 (a -1 adds nothing). Returns the drafts
// part; `inputs.output_token_ids` is the rest.
std::vector<int32_t> DraftsBefore(const RequestInputs& inputs, StepKind kind, int32_t row_index);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_TOKEN_UPDATES_H_
