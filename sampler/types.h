// Core types of samplerd: a step's inputs as sent, and its results (SPEC sections 1, 2, 7).
//
// These mirror proto/samplerd/v1/sampler.proto without depending on protobuf: server/
// converts between the two, and everything in sampler/ and cuda/ speaks these types only.
//
//   Step step;
//   step.kind = StepKind::kPrefill;
//   step.vocab_size = 32000;
//   step.logits = LogitsView{...};
//   step.requests.push_back(RequestInputs{.request_id = "a", .row = 0});
#ifndef SAMPLERD_SAMPLER_TYPES_H_
#define SAMPLERD_SAMPLER_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "sampler/dtype_enum.h"

namespace samplerd {

enum class StepKind { kPrefill, kDecode, kDraft };

// Bytes per element of `dtype`.
int DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
const char* StepKindName(StepKind kind);

// One tensor-parallel shard of a device view (issue 47): the logits' columns
// [col_begin, col_begin + cols), each row `row_stride` elements after the last, read in place.
struct LogitsShard {
  const void* data = nullptr;  // device memory: column col_begin of row 0
  int64_t row_stride = 0;      // elements; >= cols
  int32_t col_begin = 0;
  int32_t cols = 0;
  const void* ready_event = nullptr;  // as LogitsView::ready_event, this shard's producer's
};

// The most device shards one tensor may have: the kernels look a column's shard up by a scan.
constexpr int kMaxDeviceShards = 16;

// A [rows, cols] matrix of logits somewhere in memory, row-major, `row_stride` elements apart.
// Borrowed: whoever built the view keeps the memory alive (and checked its extent) until the
// step is answered. `on_device` says whether `data` is a CUDA device pointer.
// A device view may instead be the columns of `shards` side by side (tensor-parallel logits in
// several ranks' memory, never gathered): then `data` is shards[0]'s, `row_stride` is `cols`
// (only the shards' own strides address memory) and `ready_event` is null (each shard has its
// own).
struct LogitsView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int32_t rows = 0;
  int32_t cols = 0;
  int64_t row_stride = 0;  // elements; always >= cols once built
  bool on_device = false;
  // Device views only: an event (the backend's native type, opaque here) that the backend's
  // stream waits on before reading; null = the producer already synchronised.
  const void* ready_event = nullptr;
  std::vector<LogitsShard> shards;  // device views only; empty: one tensor at `data`

  // Bytes the view spans: (rows - 1) * row_stride + cols elements; -1 if that overflows (a
  // view built from a request never does: proto_convert checks it with TensorByteExtent).
  int64_t ByteExtent() const;
  const void* Row(int32_t row) const {
    return static_cast<const char*>(data) +
           static_cast<int64_t>(row) * row_stride * DTypeSize(dtype);
  }
};

// Sampling parameters as sent; unset fields take SPEC section 2's defaults.
struct SamplingParams {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  std::optional<int32_t> top_logprobs;
  std::optional<uint64_t> seq_seed;
  // Token adjustments (SPEC 2; SPEC 3 step 2): all off when empty / 0.
  std::vector<int32_t> allowed_token_ids;          // empty = every token
  std::vector<std::vector<int32_t>> bad_words;     // token-id sequences
  int32_t min_tokens = 0;                          // with stop_token_ids
  std::vector<int32_t> stop_token_ids;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias); the proto's map entries
  // DRY (SPEC 3 step 3): off while dry_multiplier is 0.
  float dry_multiplier = 0.0f;
  std::optional<float> dry_base;               // absent = 1.75
  std::optional<int32_t> dry_allowed_length;   // absent = 2
  std::vector<int32_t> dry_sequence_breakers;
  int32_t dry_range = 0;                       // 0 = the whole context
  // Top-nσ (SPEC 3 step 4) and XTC (step 8): off while 0.
  float top_n_sigma = 0.0f;
  float xtc_probability = 0.0f;
  std::optional<float> xtc_threshold;          // absent = 0.1
  // SPEC 7: 0 = processed logprobs, 1 = raw (the row's log_softmax as sent); as the proto's
  // LogprobsMode, other values refused by NormalizeParams.
  int32_t logprobs_mode = 0;
};

// Draft distributions sent with a DECODE request (SPEC section 6).
struct DraftDistributions {
  enum class Form {
    kPool,   // none sent: the server's draft pool (the speculative-decoding issue)
    kDense,  // `values` is [q - 1, cols] of processed logprobs
    kTopN,   // `values` is [q - 1, N], `token_ids` the matching [q - 1, N] ids
  };
  Form form = Form::kPool;
  LogitsView values;
  std::vector<int32_t> token_ids;
};

// One request (sequence) of a step, as sent. Which fields matter depends on the step kind.
struct RequestInputs {
  std::string request_id;
  SamplingParams params;
  int32_t row = 0;                      // PREFILL
  int32_t first_row = 0;                // DECODE
  int32_t num_rows = 0;                 // DECODE: q
  std::vector<int32_t> rows;            // DRAFT
  std::vector<int32_t> draft_indices;   // DRAFT: i in 1..nextn, one per row
  int64_t sample_position = 0;
  int64_t last_valid_offset = 0;        // DRAFT
  std::vector<int32_t> draft_token_ids; // DECODE: q - 1 drafts, -1 = outside the top-N
  DraftDistributions drafts;            // DECODE
  std::vector<int32_t> golden_token_ids;             // PREFILL, DECODE; -1 = none
  std::vector<std::string> allowed_token_masks;      // one per sampled row; "" = none
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;
  int32_t prompt_first_row = 0;         // PREFILL
  std::vector<int32_t> prompt_targets;  // PREFILL
};

// Where a step's tokens also go in the caller's device memory (the proto's StepOutput), already
// resolved and bounds-checked by the pipeline; the CUDA backend writes them after the step.
// Null pointers: not asked for.
struct StepOutputTarget {
  void* token_ids = nullptr;       // int32 [requests][tokens_per_request]
  int32_t tokens_per_request = 1;
  void* num_accepted = nullptr;    // int32 [requests]
  void* done_word = nullptr;       // uint32, set to done_value last
  uint32_t done_value = 0;
  const void* done_event = nullptr;  // the backend's native event, recorded after the writes
  bool any() const {
    return token_ids != nullptr || num_accepted != nullptr || done_word != nullptr ||
           done_event != nullptr;
  }
};

// One call: one logits tensor and the requests that read it.
struct Step {
  uint64_t step_id = 0;
  StepKind kind = StepKind::kPrefill;
  int32_t vocab_size = 0;
  int32_t force_top_n = 0;  // 0 = off
  bool compute_sum_smaller_probs = false;
  LogitsView logits;
  std::vector<RequestInputs> requests;
  // Whose draft pool entries the step stores and takes (DraftPoolKey): the server sets it from
  // the caller's identity, so clients never consume each other's drafts. "" = unscoped.
  std::string pool_scope;
  StepOutputTarget output;
};

// The top logprobs of one emitted token: descending, ties by lower id, padded with (-1, -inf).
struct TopLogprobs {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
};

// The answer for one request. When `status` is not OK the other fields are empty except
// `request_id` (and `seq_seed` where it was known).
struct RequestResult {
  std::string request_id;
  absl::Status status;
  std::vector<int32_t> token_ids;
  int32_t num_accepted = 0;
  std::vector<float> logprobs;
  std::vector<TopLogprobs> top_logprobs;
  std::vector<float> sum_smaller_probs;  // only when the step asked for them
  std::vector<float> prompt_logprobs;
  uint64_t seq_seed = 0;
};

struct StepResult {
  uint64_t step_id = 0;
  std::vector<RequestResult> results;  // one per request, in request order
  // Device time of the step's launches (CUDA events), in microseconds; 0 on the CPU backend.
  // The rest of the backend's time is host work around them.
  float kernel_us = 0.0f;
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_TYPES_H_
