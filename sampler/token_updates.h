// The logits-processor seam: every per-token change SPEC 3 makes to a sampled row between its
// mask and force top-N, as one sparse list per row that each backend applies in one place
// (RowProcessor on the CPU, the row prologue on CUDA), with spec_rules.h's UpdateToken.
//
// SPEC 3 step 2a (allowed_token_ids) is a set of tokens, not a per-token value: PlanStep folds
// it into the row's mask (RequestPlan::owned_masks). Steps 2b-d (bad words, min_tokens' stop
// ids, logit bias) and step 3 (penalties) are entries here (spec_rules.h's TokenUpdate: a ban,
// a bias before the penalties, the penalty history, a bias after them), merged per token and
// sorted by token, so a row costs what its request holds (its bias entries, its words, its
// history), never V. Entries compose: bans win, biases add, counts add; so a new per-token
// adjustment is data here, and no backend changes (ARCHITECTURE.md, "How to add a per-token
// adjustment").
//
//   std::vector<TokenUpdate> updates = request_plan.RowUpdates(step.kind, row_index);
//   for (const TokenUpdate& u : updates) x[u.token] = UpdateToken(x[u.token], u, penalties, &bad);
#ifndef SAMPLERD_SAMPLER_TOKEN_UPDATES_H_
#define SAMPLERD_SAMPLER_TOKEN_UPDATES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sampler/spec_rules.h"
#include "sampler/types.h"

namespace samplerd {

// The DRY penalty's settings after SPEC 2's checks (SPEC 3 step 3).
struct DryPenalty {
  float multiplier = 0.0f;  // 0 = off
  float base = 1.75f;
  int32_t allowed_length = 2;
  std::vector<int32_t> breakers;  // sorted, unique
  int32_t range = 0;              // the context's last `range` tokens; 0 = all
  bool on() const { return multiplier > 0.0f; }
};

// A request's token adjustments after SPEC 2's checks (CheckAdjustments), in the form rows use.
struct TokenAdjustments {
  std::vector<std::vector<int32_t>> bad_words;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;                // sorted, unique
  std::vector<std::pair<int32_t, float>> logit_bias;  // sorted by token, unique
  DryPenalty dry;
  bool empty() const {
    return bad_words.empty() && (min_tokens == 0 || stop_token_ids.empty()) &&
           logit_bias.empty() && !dry.on();
  }
};

// SPEC 2's checks of a request's token adjustments (allowed and stop ids, min_tokens, bad
// words, logit bias, DRY: each list's length against `max_token_list`, its values, its ids
// against V), in that order; then the adjustments as rows use them. INVALID_ARGUMENT naming
// the field under `request_field` ("requests[i]"). allowed_token_ids is checked here but
// folded into the rows' masks by PlanStep (validate.cc).
absl::StatusOr<TokenAdjustments> CheckAdjustments(const SamplingParams& params,
                                                  int32_t vocab_size, int32_t max_token_list,
                                                  const std::string& request_field);

// The updates of one sampled row, sorted by token, one entry per token. `output` is the row's
// output history (SPEC 3): the request's output_token_ids, then for row j of a DECODE request
// the drafts of rows 0..j-1 that are not -1 (`drafts_before`); `prompt` counts for the
// repetition penalty only.
std::vector<TokenUpdate> RowTokenUpdates(const TokenAdjustments& adjustments,
                                         const PenaltySettings& penalties,
                                         absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> output,
                                         absl::Span<const int32_t> drafts_before);

// SPEC 3 step 3's penalty history of a request's prompt and output, merged (sorted by token,
// one entry per token): what every row of the request shares, built once per request (issue
// 45: each DECODE row rebuilt and re-sorted its whole context, ~20 bytes a token, q times).
std::vector<TokenUpdate> HistoryUpdates(absl::Span<const int32_t> prompt,
                                        absl::Span<const int32_t> output);

// RowTokenUpdates with the request's history already merged: `history` is HistoryUpdates of
// its prompt and output (used only when `penalties` are on). The same entries, bitwise; a
// row's own cost is its adjustments, its drafts and its DRY entries, plus one linear merge.
std::vector<TokenUpdate> RowTokenUpdates(const TokenAdjustments& adjustments,
                                         const PenaltySettings& penalties,
                                         const std::vector<TokenUpdate>& history,
                                         absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> output,
                                         absl::Span<const int32_t> drafts_before);

// SPEC 3 step 3's DRY entries of one row (kUpdateLateBias, late_bias = -penalty, one per
// penalised token, unsorted): the context is prompt, output, drafts_before, cut to its last
// dry.range tokens. O(context x 50) at worst (the match cap); nothing V-sized.
std::vector<TokenUpdate> DryUpdates(const DryPenalty& dry, absl::Span<const int32_t> prompt,
                                    absl::Span<const int32_t> output,
                                    absl::Span<const int32_t> drafts_before);

// Entries from any number of sources, as one list sorted by token with one entry per token:
// bans win (kUpdateBan stays set; UpdateToken then ignores the rest), biases of a kind add (in
// the order appended), history counts add. RowTokenUpdates ends with it; a new adjustment
// appends its entries before it.
std::vector<TokenUpdate> MergeTokenUpdates(std::vector<TokenUpdate> entries);

// SPEC 3's output history of sampled row `row_index` of a request: its output_token_ids, then
// in a DECODE step the drafts of rows 0..row_index-1 (a -1 adds nothing). Returns the drafts
// part; `inputs.output_token_ids` is the rest.
std::vector<int32_t> DraftsBefore(const RequestInputs& inputs, StepKind kind, int32_t row_index);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_TOKEN_UPDATES_H_
