#include "sampler/validate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "sampler/dtype.h"
#include "sampler/memory_budget.h"
#include "sampler/row_kernels.h"
#include "sampler/spec_rules.h"
#include "sampler/status_macros.h"

namespace samplerd {
namespace {

// SPEC 6's rule for one value of a draft row: finite logprobs and -inf only.
bool BadDraftValue(float value) {
  return std::isnan(value) || value == std::numeric_limits<float>::infinity();
}

// CheckDraftRow over rows [0, rows) of a sent draft tensor, columns [0, cols), converted to
// float32 a block at a time (no allocation the size of the tensor).
absl::Status CheckDraftTensor(const LogitsView& view, int32_t rows, int32_t cols,
                              const std::string& field) {
  constexpr int32_t kBlock = 2048;
  float block[kBlock];
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t first = 0; first < cols; first += kBlock) {
      const int32_t n = std::min(kBlock, cols - first);
      LoadRowAsFloat(view, r, first, n, block);
      if (!HasNanOrPosInf(block, n)) continue;  // the vectorised common case
      for (int32_t i = 0; i < n; ++i) {
        if (BadDraftValue(block[i])) {
          return BadDraftRowError(field, r, first + i, std::isnan(block[i]));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BadDraftRowError(const std::string& field, int32_t row, int64_t entry, bool nan) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": draft row ", row, " holds ", nan ? "NaN" : "+inf", " at entry ", entry,
      "; a draft row may hold finite logprobs and -inf only (SPEC 6), whether or not "
      "verification reads that entry"));
}

absl::Status CheckDraftRow(const float* values, int32_t n, int32_t row, const std::string& field) {
  if (!HasNanOrPosInf(values, n)) return absl::OkStatus();
  for (int32_t i = 0; i < n; ++i) {
    if (BadDraftValue(values[i])) return BadDraftRowError(field, row, i, std::isnan(values[i]));
  }
  return absl::OkStatus();
}


namespace {


// The draft distributions of a DECODE request: shapes match its q - 1 drafts.
absl::Status CheckDraftDistributions(const RequestInputs& request, int32_t vocab_size,
                                     const std::string& field) {
  const int32_t drafts = request.num_rows - 1;
  const DraftDistributions& dist = request.drafts;
  if (drafts == 0) return absl::OkStatus();
  switch (dist.form) {
    case DraftDistributions::Form::kPool:
      if (request.request_id.empty()) {
        return FieldError(field + ".request_id",
                       "is required to verify drafts from the draft pool (it keys the pool)");
      }
      return absl::OkStatus();
    case DraftDistributions::Form::kDense: {
      const std::string f = field + ".draft_logprobs";
      if (dist.values.rows != drafts) {
        return FieldError(f + ".rows", absl::StrCat(dist.values.rows, " rows for ", drafts,
                                                 " drafts (num_rows - 1)"));
      }
      if (dist.values.cols < vocab_size) {
        return FieldError(f + ".cols", absl::StrCat(dist.values.cols, " is less than vocab_size = ",
                                                 vocab_size));
      }
      if (dist.values.row_stride < dist.values.cols) {
        return FieldError(f + ".row_stride", "is less than cols");
      }
      if (dist.values.data == nullptr) return FieldError(f, "has no data");
      // Device rows (issue 47) cannot be read here: the CUDA backend applies SPEC 6's rule
      // to them on the device before verifying (cuda/kernels/draft_check.cuh).
      if (dist.values.on_device) return absl::OkStatus();
      return CheckDraftTensor(dist.values, drafts, vocab_size, f);
    }
    case DraftDistributions::Form::kTopN: {
      const std::string f = field + ".draft_topn";
      const int32_t n = dist.values.cols;
      if (dist.values.rows != drafts) {
        return FieldError(f + ".values.rows", absl::StrCat(dist.values.rows, " rows for ", drafts,
                                                        " drafts (num_rows - 1)"));
      }
      if (n < 1) return FieldError(f + ".values.cols", absl::StrCat(n, " must be >= 1"));
      if (dist.values.row_stride < n) return FieldError(f + ".values.row_stride", "is less than cols");
      if (dist.values.data == nullptr) return FieldError(f + ".values", "has no data");
      if (static_cast<int64_t>(dist.token_ids.size()) != static_cast<int64_t>(drafts) * n) {
        return FieldError(f + ".token_ids", absl::StrCat("has ", dist.token_ids.size(),
                                                      " ids; [num_rows - 1, N] needs ",
                                                      static_cast<int64_t>(drafts) * n));
      }
      if (auto status = CheckTokenIds(dist.token_ids, vocab_size, /*allow_none=*/true,
                                      f + ".token_ids");
          !status.ok()) {
        return status;
      }
      if (dist.values.on_device) {  // checked on the device, as above
        if (n > kMaxDeviceTopNDraft) {
          return FieldError(f + ".values.cols",
                            absl::StrCat(n, " entries a row: a top-N draft row in device memory "
                                         "holds at most ", kMaxDeviceTopNDraft,
                                         " (send a dense draft_logprobs row instead)"));
        }
        return absl::OkStatus();
      }
      return CheckDraftTensor(dist.values, drafts, n, f + ".values");
    }
  }
  return absl::OkStatus();
}

// Checks the tensor the step reads its logits from.
absl::Status CheckLogits(const Step& step, const Limits& limits) {
  const LogitsView& logits = step.logits;
  if (logits.rows <= 0) return FieldError("logits.rows", absl::StrCat(logits.rows, " must be >= 1"));
  if (logits.cols <= 0) return FieldError("logits.cols", absl::StrCat(logits.cols, " must be >= 1"));
  if (logits.rows > limits.max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "logits.rows: ", logits.rows, " exceeds the server limit of ", limits.max_rows));
  }
  if (logits.cols > limits.max_vocab_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "logits.cols: ", logits.cols, " exceeds the server limit of ", limits.max_vocab_size));
  }
  if (logits.row_stride < logits.cols) {
    return FieldError("logits.row_stride",
                   absl::StrCat(logits.row_stride, " is less than cols = ", logits.cols));
  }
  if (logits.data == nullptr) return FieldError("logits", "has no data");
  if (step.vocab_size <= 0 || step.vocab_size > logits.cols) {
    return FieldError("inputs.vocab_size", absl::StrCat(step.vocab_size, " is outside [1, cols = ",
                                                     logits.cols, "]"));
  }
  if (step.force_top_n < 0 || step.force_top_n > limits.max_force_top_n) {
    return FieldError("inputs.force_top_n",
                   absl::StrCat(step.force_top_n, " is outside [0, ", limits.max_force_top_n,
                                "] (0 = off)"));
  }
  if (static_cast<int64_t>(step.requests.size()) > limits.max_requests) {
    return absl::ResourceExhaustedError(absl::StrCat("inputs.requests: ", step.requests.size(),
                                                     " requests exceed the server limit of ",
                                                     limits.max_requests));
  }
  return absl::OkStatus();
}

// Which rows of the logits tensor each request reads; a row may belong to one request only.
class RowClaims {
 public:
  explicit RowClaims(int32_t rows) : owner_(rows, -1), rows_(rows) {}

  // Errors name inputs.requests[request] + `suffix` (built only for an error).
  absl::Status Claim(int32_t first, int64_t count, size_t request, absl::string_view suffix) {
    auto field = [&] { return absl::StrCat("inputs.requests[", request, "]", suffix); };
    if (count < 0) return FieldError(field(), absl::StrCat("row count ", count, " is negative"));
    if (first < 0 || first + count > rows_) {
      return FieldError(field(), absl::StrCat("rows [", first, ", ", first + count,
                                           ") exceed the tensor's ", rows_, " rows"));
    }
    for (int64_t r = first; r < first + count; ++r) {
      const int32_t owner = owner_[r];
      if (owner != -1 && owner != static_cast<int32_t>(request)) {
        return FieldError(field(), absl::StrCat("row ", r, " is also read by inputs.requests[",
                                             owner, "]; row ranges must not overlap"));
      }
      owner_[r] = static_cast<int32_t>(request);
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int32_t> owner_;
  int32_t rows_;
};

// Step-level row checks of one request: every row it reads lies in the tensor, unshared.
absl::Status ClaimRows(const Step& step, size_t index, RowClaims& claims) {
  const RequestInputs& request = step.requests[index];
  switch (step.kind) {
    case StepKind::kPrefill:
      if (auto status = claims.Claim(request.row, 1, index, ".row"); !status.ok()) {
        return status;
      }
      if (!request.prompt_targets.empty()) {
        return claims.Claim(request.prompt_first_row,
                            static_cast<int64_t>(request.prompt_targets.size()), index,
                            ".prompt_first_row");
      }
      return absl::OkStatus();
    case StepKind::kDecode:
      if (request.num_rows < 1) {
        return FieldError(absl::StrCat("inputs.requests[", index, "].num_rows"),
                       absl::StrCat(request.num_rows, " must be >= 1"));
      }
      return claims.Claim(request.first_row, request.num_rows, index, ".first_row");
    case StepKind::kDraft:
      for (size_t j = 0; j < request.rows.size(); ++j) {
        if (auto status = claims.Claim(request.rows[j], 1, index, absl::StrCat(".rows[", j, "]"));
            !status.ok()) {
          return status;
        }
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// SPEC 2's token adjustments of one request, checked beside their update code
// (CheckAdjustments, token_updates.h); then allowed_token_ids folded into each sampled row's
// mask (SPEC 3 step 2a: a token not listed gets -inf, as a masked one does). `request_field`
// names the request ("requests[i]").
absl::Status PlanAdjustments(const SamplingParams& params, int32_t vocab_size,
                             const std::string& request_field, const Limits& limits,
                             int64_t* step_mask_bytes, RequestPlan& plan) {
  ASSIGN_OR_RETURN(plan.adjustments,
                   CheckAdjustments(params, vocab_size, limits.max_token_list, request_field));
  // The params' field, built only for an error.
  auto field = [&] { return absl::StrCat(request_field, ".params"); };
  if (params.allowed_token_ids.empty()) return absl::OkStatus();
  // The allowed ids' mask, shared by rows without a grammar mask; AND-ed with each row's own.
  const size_t bytes = 4 * ((static_cast<size_t>(vocab_size) + 31) / 32);
  int64_t masks = 1;
  for (const SampledRow& row : plan.sampled_rows) masks += row.mask != nullptr;
  const int64_t need = masks * static_cast<int64_t>(bytes);  // <= (rows + 1) * 512 KiB
  if (need > limits.max_step_mask_bytes - *step_mask_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field(), ".allowed_token_ids: the step's allowed-token masks would take more than the "
        "server's ", limits.max_step_mask_bytes, " bytes (", masks, " masks of ", bytes,
        " bytes here)"));
  }
  *step_mask_bytes += need;
  auto allowed = std::make_shared<std::vector<unsigned char>>(bytes, 0);
  for (int32_t t : params.allowed_token_ids) (*allowed)[t >> 3] |= static_cast<unsigned char>(1u << (t & 7));
  for (SampledRow& row : plan.sampled_rows) {
    if (row.mask == nullptr) {
      row.mask = allowed->data();
      continue;
    }
    auto both = std::make_shared<std::vector<unsigned char>>(*allowed);
    for (size_t b = 0; b < bytes; ++b) (*both)[b] &= row.mask[b];
    row.mask = both->data();
    plan.owned_masks.push_back(std::move(both));
  }
  plan.owned_masks.push_back(std::move(allowed));
  return absl::OkStatus();
}

// Request-level checks and planning (SPEC sections 1, 2, 4).
absl::Status PlanRequest(const Step& step, size_t index, const Limits& limits,
                         const SeedSource& seed_source, int64_t* step_mask_bytes,
                         RequestPlan& plan) {
  const RequestInputs& request = step.requests[index];
  const std::string field = absl::StrCat("requests[", index, "]");
  const int32_t vocab_size = step.vocab_size;

  auto params = NormalizeParams(request.params, limits, field + ".params");
  if (!params.ok()) return params.status();
  plan.params = *params;
  if (!request.params.seq_seed.has_value()) plan.params.seq_seed = seed_source();

  // The rows sampled, in emission order, with their positions.
  std::vector<SampledRow>& rows = plan.sampled_rows;
  switch (step.kind) {
    case StepKind::kPrefill:
      plan.seed = plan.params.seq_seed;
      rows.push_back(SampledRow{request.row, static_cast<uint64_t>(request.sample_position)});
      break;
    case StepKind::kDecode:
      plan.seed = plan.params.seq_seed;
      for (int32_t j = 0; j < request.num_rows; ++j) {
        SampledRow row;
        row.row = request.first_row + j;
        row.position = DecodeRowPosition(request.sample_position, j);
        row.local_step = j;
        rows.push_back(row);
      }
      break;
    case StepKind::kDraft:
      plan.seed = plan.params.seq_seed + kDraftSeedOffset;
      if (request.rows.empty()) return FieldError(field + ".rows", "is empty");
      if (request.draft_indices.size() != request.rows.size()) {
        return FieldError(field + ".draft_indices",
                       absl::StrCat("has ", request.draft_indices.size(), " entries for ",
                                    request.rows.size(), " rows"));
      }
      for (size_t j = 0; j < request.rows.size(); ++j) {
        if (request.draft_indices[j] < 1) {
          return FieldError(absl::StrCat(field, ".draft_indices[", j, "]"),
                         absl::StrCat(request.draft_indices[j], " must be >= 1"));
        }
        SampledRow row;
        row.row = request.rows[j];
        row.position = DraftPosition(request.sample_position, request.last_valid_offset,
                                     request.draft_indices[j]);
        row.local_step = static_cast<int32_t>(j);
        rows.push_back(row);
      }
      break;
  }

  // Golden tokens: one per emitted row, possibly fewer (missing = -1); none in DRAFT steps.
  if (!request.golden_token_ids.empty()) {
    if (step.kind == StepKind::kDraft) {
      return FieldError(field + ".golden_token_ids", "golden tokens are not allowed in a DRAFT step");
    }
    if (request.golden_token_ids.size() > rows.size()) {
      return FieldError(field + ".golden_token_ids",
                     absl::StrCat("has ", request.golden_token_ids.size(),
                                  " entries for ", rows.size(), " sampled rows"));
    }
    if (auto status = CheckTokenIds(request.golden_token_ids, vocab_size, /*allow_none=*/true,
                                    field, ".golden_token_ids");
        !status.ok()) {
      return status;
    }
    for (size_t j = 0; j < request.golden_token_ids.size(); ++j) {
      rows[j].golden = request.golden_token_ids[j];
    }
  }

  // Grammar masks: absent, or one per sampled row, each empty or at least ceil(V / 32) words.
  if (!request.allowed_token_masks.empty()) {
    if (request.allowed_token_masks.size() != rows.size()) {
      return FieldError(field + ".allowed_token_masks",
                     absl::StrCat("has ", request.allowed_token_masks.size(),
                                  " masks for ", rows.size(), " sampled rows"));
    }
    const size_t min_bytes = 4 * ((static_cast<size_t>(vocab_size) + 31) / 32);
    for (size_t j = 0; j < rows.size(); ++j) {
      const std::string& mask = request.allowed_token_masks[j];
      if (mask.empty()) continue;
      if (mask.size() % 4 != 0 || mask.size() < min_bytes) {
        return FieldError(absl::StrCat(field, ".allowed_token_masks[", j, "]"),
                       absl::StrCat(mask.size(), " bytes; a mask needs at least ceil(V / 32) = ",
                                    min_bytes / 4, " whole int32 words"));
      }
      rows[j].mask = reinterpret_cast<const unsigned char*>(mask.data());
    }
  }

  if (auto status = PlanAdjustments(request.params, vocab_size, field, limits,
                                    step_mask_bytes, plan);
      !status.ok()) {
    return status;
  }

  if (auto status = CheckTokenIds(request.prompt_token_ids, vocab_size, false,
                                  field, ".prompt_token_ids");
      !status.ok()) {
    return status;
  }
  if (auto status = CheckTokenIds(request.output_token_ids, vocab_size, false,
                                  field, ".output_token_ids");
      !status.ok()) {
    return status;
  }

  if (step.kind == StepKind::kDraft && request.request_id.empty()) {
    return FieldError(field + ".request_id", "is required in DRAFT steps (it keys the draft pool)");
  }
  if (step.kind == StepKind::kPrefill) {
    if (auto status = CheckTokenIds(request.prompt_targets, vocab_size, false,
                                    field, ".prompt_targets");
        !status.ok()) {
      return status;
    }
  } else if (!request.prompt_targets.empty()) {
    return FieldError(field + ".prompt_targets", "prompt logprobs are for PREFILL steps only");
  }

  if (step.kind == StepKind::kDecode) {
    const size_t drafts = static_cast<size_t>(request.num_rows) - 1;
    if (request.draft_token_ids.size() != drafts) {
      return FieldError(field + ".draft_token_ids",
                     absl::StrCat("has ", request.draft_token_ids.size(), " drafts; num_rows = ",
                                  request.num_rows, " needs ", drafts));
    }
    if (auto status = CheckTokenIds(request.draft_token_ids, vocab_size, /*allow_none=*/true,
                                    field, ".draft_token_ids");
        !status.ok()) {
      return status;
    }
    if (auto status = CheckDraftDistributions(request, vocab_size, field); !status.ok()) {
      return status;
    }
  } else if (!request.draft_token_ids.empty()) {
    return FieldError(field + ".draft_token_ids", "drafts are verified in DECODE steps only");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NormalizedParams> NormalizeParams(const SamplingParams& params,
                                                 const Limits& limits, const std::string& field) {
  NormalizedParams out;
  if (params.temperature) {
    const float t = *params.temperature;
    if (std::isnan(t) || t < 0.0f) {
      return FieldError(field + ".temperature", absl::StrCat(t, " must be >= 0"));
    }
    out.temperature = t;
  }
  if (params.top_p) {
    const float p = *params.top_p;
    if (!(p > 0.0f && p <= 1.0f)) return FieldError(field + ".top_p", absl::StrCat(p, " is outside (0, 1]"));
    out.top_p = p;
  }
  if (params.top_k) {
    const int32_t k = *params.top_k;
    if (k == 0 || k < -1) {
      return FieldError(field + ".top_k", absl::StrCat(k, " must be -1 (off) or >= 1"));
    }
    out.top_k = k;
  }
  if (params.min_p) {
    const float p = *params.min_p;
    if (!(p >= 0.0f && p <= 1.0f)) return FieldError(field + ".min_p", absl::StrCat(p, " is outside [0, 1]"));
    out.min_p = p;
  }
  if (params.repetition_penalty) {
    const float r = *params.repetition_penalty;
    if (!(r > 0.0f) || std::isinf(r)) {
      return FieldError(field + ".repetition_penalty", absl::StrCat(r, " must be finite and > 0"));
    }
    out.repetition_penalty = r;
  }
  if (params.presence_penalty) {
    const float v = *params.presence_penalty;
    if (!(v >= -2.0f && v <= 2.0f)) {
      return FieldError(field + ".presence_penalty", absl::StrCat(v, " is outside [-2, 2]"));
    }
    out.presence_penalty = v;
  }
  if (params.frequency_penalty) {
    const float v = *params.frequency_penalty;
    if (!(v >= -2.0f && v <= 2.0f)) {
      return FieldError(field + ".frequency_penalty", absl::StrCat(v, " is outside [-2, 2]"));
    }
    out.frequency_penalty = v;
  }
  if (params.top_logprobs) {
    const int32_t n = *params.top_logprobs;
    if (n < 0 || n > limits.max_top_logprobs) {
      return FieldError(field + ".top_logprobs", absl::StrCat(n, " is outside [0, ",
                                                           limits.max_top_logprobs,
                                                           "] (the server's limit)"));
    }
    out.top_logprobs = n;
  }
  if (params.seq_seed) out.seq_seed = *params.seq_seed;
  if (!(params.top_n_sigma >= 0.0f && params.top_n_sigma <= 100.0f)) {
    return FieldError(field + ".top_n_sigma",
                      absl::StrCat(params.top_n_sigma, " is outside [0, 100]"));
  }
  out.top_n_sigma = params.top_n_sigma;
  if (!(params.xtc_probability >= 0.0f && params.xtc_probability <= 1.0f)) {
    return FieldError(field + ".xtc_probability",
                      absl::StrCat(params.xtc_probability, " is outside [0, 1]"));
  }
  out.xtc_probability = params.xtc_probability;
  if (params.xtc_threshold) {
    const float v = *params.xtc_threshold;
    if (!(v >= 0.0f && v <= 1.0f)) {
      return FieldError(field + ".xtc_threshold", absl::StrCat(v, " is outside [0, 1]"));
    }
    out.xtc_threshold = v;
  }
  if (params.logprobs_mode != 0 && params.logprobs_mode != 1) {
    return FieldError(field + ".logprobs_mode",
                      absl::StrCat(params.logprobs_mode, " is not PROCESSED (0) or RAW (1)"));
  }
  out.raw_logprobs = params.logprobs_mode == 1;
  // SPEC section 2: a near-zero temperature becomes SAMPLING_EPS and turns the filters off.
  if (out.temperature < kSamplingEps) {
    out.temperature = kSamplingEps;
    out.top_p = 1.0f;
    out.top_k = -1;
    out.min_p = 0.0f;
    out.top_n_sigma = 0.0f;
    out.xtc_probability = 0.0f;
  }
  return out;
}

absl::StatusOr<StepPlan> PlanStep(const Step& step, const Limits& limits,
                                  const SeedSource& seed_source) {
  if (auto status = CheckLogits(step, limits); !status.ok()) return status;
  RowClaims claims(step.logits.rows);
  for (size_t i = 0; i < step.requests.size(); ++i) {
    if (auto status = ClaimRows(step, i, claims); !status.ok()) return status;
  }
  StepPlan plan;
  plan.step = &step;
  plan.requests.resize(step.requests.size());
  absl::flat_hash_map<std::string, size_t> seen_ids;
  int64_t step_mask_bytes = 0;  // made for allowed_token_ids so far
  for (size_t i = 0; i < step.requests.size(); ++i) {
    RequestPlan& request = plan.requests[i];
    request.inputs = &step.requests[i];
    request.status = PlanRequest(step, i, limits, seed_source, &step_mask_bytes, request);
    const std::string& id = step.requests[i].request_id;
    if (request.status.ok() && !id.empty()) {
      auto [it, inserted] = seen_ids.emplace(id, i);
      if (!inserted) {
        request.status = FieldError(absl::StrCat("requests[", i, "].request_id"),
                                 absl::StrCat("'", id, "' is also requests[", it->second, "]"));
      }
    }
    if (!request.status.ok()) request.sampled_rows.clear();
  }
  return plan;
}

}  // namespace samplerd
