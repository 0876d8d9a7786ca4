// A checked step's plan: what the backends run (Sample(StepPlan)), apart from the checks that
// make it (sampler/validate.h, PlanStep) so that a backend needs the plan's types only
// (issue 48). Per request: its normalised parameters, the rows it samples with their
// random-number positions, golden tokens and masks, its token adjustments; the server's
// limits; the seed source; and the row updates made before the backend (PrepareRowUpdates).
#ifndef SAMPLERD_SAMPLER_PLAN_H_
#define SAMPLERD_SAMPLER_PLAN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "sampler/token_updates.h"
#include "sampler/types.h"

namespace samplerd {

class MemoryBudget;

// Temperatures below this become it, and turn top-p, top-k and min-p off (SPEC section 2).
inline constexpr float kSamplingEps = 1e-5f;
// Prompt logprobs are computed in chunks of at most this many rows (SPEC section 7).
inline constexpr int32_t kPromptLogprobChunkRows = 8192;

// Server-wide limits. Defaults are the documented server defaults.
struct Limits {
  int32_t max_top_logprobs = 64;    // SPEC 7: at least 20
  int32_t max_rows = 1 << 20;       // rows of one logits tensor
  int32_t max_vocab_size = 1 << 22; // vocab_size and cols
  int32_t max_force_top_n = 16384;  // as the seed's remap_draft_topk bound on NVIDIA
  int32_t max_requests = 1 << 16;   // requests of one step
  // The longest token list of a request's adjustments (SPEC 2): allowed_token_ids,
  // stop_token_ids, logit_bias entries, and bad_words (their tokens, all words together).
  int32_t max_token_list = 16384;
  // The masks allowed_token_ids make (ceil(V / 32) words per request, and per sampled row that
  // also has a grammar mask), all requests of a step together: the server sets it to its
  // message size limit, the bound the grammar masks sent in a step already have.
  int64_t max_step_mask_bytes = int64_t{64} << 20;
  // A request's history work (issue 45): its context tokens (prompt, output, drafts) times its
  // sampled rows, where it has penalties or DRY. Beyond it the request fails alone
  // (RESOURCE_EXHAUSTED); its memory is reserved from the request budget besides.
  int64_t max_context_token_rows = int64_t{1} << 28;
};

// Parameters after SPEC section 2's checks and normalisation.
struct NormalizedParams {
  float temperature = 1.0f;  // >= kSamplingEps
  float top_p = 1.0f;        // (0, 1]; 1 = off
  int32_t top_k = -1;        // -1 = off, else >= 1
  float min_p = 0.0f;        // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_logprobs = 0;
  uint64_t seq_seed = 0;     // as sent, or drawn by the server
  float top_n_sigma = 0.0f;  // [0, 100]; 0 = off (and off below kSamplingEps temperature)
  float xtc_probability = 0.0f;  // [0, 1]; 0 = off (likewise)
  float xtc_threshold = 0.1f;    // [0, 1]
  bool raw_logprobs = false;     // SPEC 7's RAW logprobs mode
  bool HasPenalties() const { return Penalties().on(); }
  PenaltySettings Penalties() const {
    return PenaltySettings{repetition_penalty, presence_penalty, frequency_penalty};
  }
};

// One row that a request samples from (its draw and outputs).
struct SampledRow {
  int32_t row = 0;                   // row of the logits tensor
  uint64_t position = 0;             // random-number position (SPEC section 4)
  int32_t golden = -1;               // golden token, -1 = none
  const unsigned char* mask = nullptr;  // allowed-token bitmask, null = unconstrained
  int32_t local_step = 0;            // DECODE: j; DRAFT: index in `rows`; PREFILL: 0
};

// What the backend does for one request.
struct RequestPlan {
  absl::Status status;  // not OK: the request is answered with this and nothing is computed
  NormalizedParams params;
  uint64_t seed = 0;    // the stream seed: seq_seed, plus kDraftSeedOffset in DRAFT steps
  std::vector<SampledRow> sampled_rows;  // in emission order
  const RequestInputs* inputs = nullptr;  // borrowed from the Step
  // SPEC 3 step 2b-d, checked (sampler/token_updates.h makes each row's updates from it).
  TokenAdjustments adjustments;
  // Masks made here: allowed_token_ids alone, or AND-ed with a row's grammar mask. Sampled
  // rows point into them (SampledRow::mask).
  std::vector<std::shared_ptr<const std::vector<unsigned char>>> owned_masks;

  // Every sampled row's updates, made before the backend (PrepareRowUpdates): indexed by
  // sampled row; empty when not prepared (then RowUpdates makes them itself).
  std::vector<std::shared_ptr<const std::vector<TokenUpdate>>> prepared_updates;

  // The updates of sampled row `index` (RowTokenUpdates with this request's history): the
  // prepared list, else made now. Null when the request has none.
  std::shared_ptr<const std::vector<TokenUpdate>> RowUpdates(StepKind kind, int32_t index) const;
};

struct StepPlan {
  const Step* step = nullptr;  // borrowed; outlives the plan
  std::vector<RequestPlan> requests;
};

// Draws the 64-bit seed of a request that sent none. Must be thread-safe.
using SeedSource = std::function<uint64_t()>;
// A SeedSource backed by the operating system's entropy.
SeedSource RandomSeedSource();

// Makes every OK request's row updates now, before the backend (issue 45: a request's
// penalty history was rebuilt and sorted once per row, inside the backend's one step slot, so
// one client's long context stalled every other client's steps). Each request's history is
// merged once and shared by its rows. The memory is reserved from `budget` first (null:
// unbounded) and held by `leases` until the step ends; a request whose work exceeds
// limits.max_context_token_rows or whose memory does not fit fails alone with
// RESOURCE_EXHAUSTED naming its field.
void PrepareRowUpdates(StepPlan& plan, const Limits& limits, MemoryBudget* budget,
                       std::vector<std::shared_ptr<const void>>* leases);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_PLAN_H_
