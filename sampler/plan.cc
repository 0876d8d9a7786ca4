#include "sampler/plan.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "sampler/memory_budget.h"

namespace samplerd {

std::shared_ptr<const std::vector<TokenUpdate>> RequestPlan::RowUpdates(StepKind kind,
                                                                         int32_t index) const {
  if (index >= 0 && static_cast<size_t>(index) < prepared_updates.size()) {
    return prepared_updates[index];
  }
  // Most requests have neither: no history to gather on the step's path.
  if (adjustments.empty() && !params.HasPenalties()) return nullptr;
  const std::vector<int32_t> drafts = DraftsBefore(*inputs, kind, index);
  return std::make_shared<const std::vector<TokenUpdate>>(
      RowTokenUpdates(adjustments, params.Penalties(), inputs->prompt_token_ids,
                      inputs->output_token_ids, drafts));
}

void PrepareRowUpdates(StepPlan& plan, const Limits& limits, MemoryBudget* budget,
                       std::vector<std::shared_ptr<const void>>* leases) {
  const Step& step = *plan.step;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    RequestPlan& request = plan.requests[i];
    if (!request.status.ok() || request.sampled_rows.empty()) continue;
    const bool penalties = request.params.HasPenalties();
    if (request.adjustments.empty() && !penalties) continue;
    const RequestInputs& inputs = *request.inputs;
    const int64_t rows = static_cast<int64_t>(request.sampled_rows.size());
    const int64_t context = static_cast<int64_t>(inputs.prompt_token_ids.size() +
                                                 inputs.output_token_ids.size()) +
                            static_cast<int64_t>(inputs.draft_token_ids.size());
    const std::string field = absl::StrCat("requests[", i, "]");
    // The history work: what each row reads of the context (DRY scans it; the penalties merge
    // up to min(context, V) entries a row).
    if (context > 0 && rows > limits.max_context_token_rows / context) {
      request.status = absl::ResourceExhaustedError(absl::StrCat(
          field, ".prompt_token_ids: ", context, " context tokens in each of ", rows,
          " sampled rows exceed the server's bound of ", limits.max_context_token_rows,
          " context tokens x rows for penalties and DRY (--max_context_token_rows)"));
      continue;
    }
    if (budget != nullptr) {
      // Bytes: the history's sorted token ids (4 a token) and its entries (one a distinct
      // token), each row's list (at most one entry a token of the vocabulary, and no more than
      // the context and the row's own entries), and DRY's per-row scratch (positions and
      // matches, 12 bytes a context token).
      const int64_t entry = static_cast<int64_t>(sizeof(TokenUpdate));
      const int64_t own = static_cast<int64_t>(request.adjustments.logit_bias.size() +
                                               request.adjustments.stop_token_ids.size() +
                                               request.adjustments.bad_words.size()) +
                          static_cast<int64_t>(inputs.draft_token_ids.size()) +
                          (request.adjustments.dry.on() ? context : 0);
      const int64_t per_row = std::min<int64_t>(step.vocab_size, (penalties ? context : 0) + own);
      const int64_t history =
          penalties ? 4 * context + std::min<int64_t>(context, step.vocab_size) * entry : 0;
      const int64_t bytes = history + rows * per_row * entry +
                            (request.adjustments.dry.on() ? 12 * context : 0);
      auto lease = budget->Reserve(bytes, field + ".prompt_token_ids");
      if (!lease.ok()) {
        request.status = absl::ResourceExhaustedError(absl::StrCat(
            lease.status().message(), " (the penalty and DRY history of ", context,
            " context tokens over ", rows, " rows; --max_request_memory_bytes)"));
        continue;
      }
      leases->push_back(*std::move(lease));
    }
    const std::vector<TokenUpdate> history =
        penalties ? HistoryUpdates(inputs.prompt_token_ids, inputs.output_token_ids)
                  : std::vector<TokenUpdate>();
    request.prepared_updates.resize(request.sampled_rows.size());
    for (size_t r = 0; r < request.sampled_rows.size(); ++r) {
      const std::vector<int32_t> drafts =
          DraftsBefore(inputs, step.kind, static_cast<int32_t>(r));
      request.prepared_updates[r] = std::make_shared<const std::vector<TokenUpdate>>(
          RowTokenUpdates(request.adjustments, request.params.Penalties(), history,
                          inputs.prompt_token_ids, inputs.output_token_ids, drafts));
    }
  }
}

SeedSource RandomSeedSource() {
  return [] {
    // std::random_device reads the OS entropy pool; thread-safe per call.
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
  };
}

}  // namespace samplerd
