// Launchers of samplerd's CUDA sampling kernels (host header: compiles without nvcc).
//
// Where the vocabulary fits FusedPathFits, a step's jobs are split by SplitPathEligible (each
// job's own parameters, so a row's path never depends on the batch): eligible rows (a small
// top-k) run as LaunchSplitRows (independent blocks over chunks of each row, the last of
// which finishes the row), the rest as LaunchFusedRows (a cluster per row); then the rows with
// RAW logprobs as LaunchRawRows (a cluster per row reads the row as sent and overwrites the
// reported logprobs). Otherwise three launches on the caller's stream:
//   LaunchPrepareRows   logits (fp32/bf16/fp16) -> workspace x: padding, grammar mask, NaN
//                       check, per-row max; several blocks per row.
//   LaunchRowUpdates    sparse token updates of x: adjustments, then penalties.
//   LaunchSampleRows    one block per row: force top-N, temperature, top-p, top-k, min-p,
//                       log_softmax, the seeded draw, verification, outputs.
//
//   RETURN_IF_ERROR(params.Validate());
//   LaunchPrepareRows(params, stream); LaunchRowUpdates(params, stream);
//   LaunchSampleRows(params, stream);
//
// Every reduction has a fixed order that depends on V only, never on the number of rows or
// their layout, so results are batch invariant and bitwise repeatable.
#ifndef SAMPLERD_CUDA_SAMPLING_LAUNCH_H_
#define SAMPLERD_CUDA_SAMPLING_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "sampler/dtype_enum.h"
#include "sampler/spec_rules.h"

namespace samplerd {
namespace cuda {

inline constexpr int kMaxTopLogprobs = 64;  // per-row output capacity
inline constexpr int kSplitChunk = 8192;    // tokens of a row per block on the split path
inline constexpr int kSplitMaxK = 64;       // the largest top_k the split path takes
// From this many split rows on, a block a row streams its chunks (SplitStreamKernel): the rows
// alone then give every SM two blocks or more (132 SMs on an H100 or H200). gpu_bench, H100,
// 2026-12-07: streaming 181 against 221 us at R = 384, 2,847 against 4,137 at R = 8,192 (fp32);
// at R <= 16 a row's 16 chunks in turn take ~99 us against ~24 by 16 blocks.
inline constexpr int kSplitStreamRows = 256;

// What a row job computes.
enum RowJobKind : int32_t {
  kRowFresh = 0,    // draw a token (or take the golden one)
  kRowVerify = 1,   // DECODE verify row: accept/reject draft, replacement on rejection
  kRowPrompt = 2,   // prompt logprob of `target` only (SPEC 3 steps 1, 5, 6, 7)
};

// One shard of a step's logits in device memory (LogitsShard as the kernels read it).
struct DeviceShard {
  const char* data;    // column col_begin of row 0
  int64_t row_stride;  // elements
  int32_t col_begin;   // the shard holds columns [col_begin, col_end)
  int32_t col_end;
};

// One row of work. All pointers are device pointers. Filled on the host, copied per step.
struct RowJob {
  // in: which logits row (of the step's tensor) this job reads; -1 never.
  int32_t logits_row;
  RowJobKind kind;
  float temperature;        // > 0 (already normalised)
  float top_p;              // (0, 1]; 1 = off
  int32_t top_k;            // -1 = off
  float min_p;              // [0, 1]; 0 = off (ignored for kRowPrompt)
  int32_t top_logprobs;     // [0, kMaxTopLogprobs]
  int32_t force_top_n;      // 0 = off (ignored for kRowPrompt)
  int32_t golden;           // -1 = none
  int32_t draft_token;      // kRowVerify: the draft d_j (-1 = outside the target's top-N)
  int32_t target;           // kRowPrompt: the prompt target
  int32_t want_sum_smaller; // 0/1
  uint64_t seed;            // stream seed
  uint64_t position;        // random-number position
  const unsigned char* mask;  // grammar bitmask (ceil(V/32) words), null = none
  // kRowVerify: the draft's logprobs row, read through DraftLogprob: [V] dense (q_n = 0) or
  // the [q_n] values of a top-N row whose ids are q_ids; of dtype q_dtype. Rows from the
  // host and the pool are float32 and dense; a worker's device rows (issue 47) are read in
  // place, in their own dtype, and checked on the device first (q_check: CheckDraftRows).
  const void* q_values;
  const int32_t* q_ids;
  DType q_dtype;
  int32_t q_n;
  int32_t q_check;
  // Issue 50 (SPEC 3 steps 4 and 8, SPEC 7). XTC acts on the kept set, which every path
  // holds (FinishCandidates, or the general algorithm); top-nσ needs the whole row's mean and
  // deviation, which the fused path's resident row gives (the split path does not take it);
  // RAW logprobs are reported by LaunchRawRows after the paths (by the general algorithm on the
  // three-launch path). top_n_sigma and xtc are ignored for kRowPrompt.
  float top_n_sigma;        // > 0: keep x >= max - n * sigma of the finite x after step 4
  int32_t xtc;              // 1: this row's XTC draw fired (the host's XtcUniform < probability)
  float xtc_threshold;
  int32_t raw_logprobs;     // 1: reported logprobs (token, top, prompt) from the raw logits
  float* pool_out;          // DRAFT rows: write processed logprobs [V] here, or null
  int32_t update_begin;     // [begin, end) of this job's entries in StepParams::updates
  int32_t update_end;
};

// The updates of one token of one job's row (SPEC 3 steps 2b-d and 3): the host's merged
// entry (sampler/spec_rules.h's TokenUpdate) with its request's penalties, applied by
// UpdateToken as on the CPU.
struct RowUpdate {
  TokenUpdate update;
  PenaltySettings penalties;
};

// RowResult::status bits. A row may carry more than one; the host reports them in SPEC 3's
// order of checks: a non-finite logit, then an overflow, then an empty kept set.
enum RowStatus : int32_t {
  kRowNonFinite = 1,  // NaN or +inf among the row's real columns
  kRowNoToken = 2,    // no token left after steps 1-8
  kRowOverflow = 4,   // a bias, a penalty or the temperature pushed a finite value out of float32
};

// What a row job produces (device, copied back per step).
struct RowResult {
  int32_t status;           // 0 OK, else a set of RowStatus bits
  int32_t token;            // drawn / golden / accepted draft / replacement
  int32_t accepted;         // kRowVerify
  float logprob;
  float sum_smaller;
  float prompt_logprob;     // kRowPrompt
  // kRowVerify with q_check: 0, or SPEC 6's fault of its draft row, the first NaN or +inf:
  // ~(entry * 2 + is_nan) (CheckDraftRows keeps the smallest entry with an atomic max).
  unsigned long long draft_fault;
  int32_t top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

// Parameters of one step's launches.
struct StepParams {
  // in: the step's logits, device memory, [rows, >= V] with row_stride elements a row.
  const void* logits = nullptr;
  DType dtype = DType::kFloat32;
  int64_t row_stride = 0;
  int32_t vocab_size = 0;          // V (columns >= V are padding)
  // in (issue 47): tensor-parallel logits read in place, [num_shards] in device memory, in
  // column order from column 0; then `logits` and `row_stride` are unused. 0: one tensor.
  const DeviceShard* shards = nullptr;
  int32_t num_shards = 0;
  // in: jobs [num_jobs] and token updates [num_updates], device memory.
  const RowJob* jobs = nullptr;
  int32_t num_jobs = 0;
  const RowUpdate* updates = nullptr;
  int32_t num_updates = 0;
  // scratch: [num_jobs, V] floats (x after steps 1-3) and [num_jobs] row maxima (ordered ints).
  float* workspace = nullptr;
  unsigned int* row_max = nullptr;
  // out: [num_jobs].
  RowResult* results = nullptr;
  // The split path's jobs (indices into jobs) and its scratch (SplitScratchBytes); the fused
  // path's jobs (null: every job).
  const int32_t* split_jobs = nullptr;
  int32_t num_split = 0;
  void* split_scratch = nullptr;
  // [num_split] arrival counters of the rows' chunk blocks: zero before a launch, and the
  // kernel leaves them zero (the last arrival of each row resets its own).
  unsigned int* split_arrivals = nullptr;
  // 1: the split jobs stream, one block a row over its chunks in turn (SplitStreamKernel),
  // rather than one block a chunk (SplitRowKernel): the host's choice by the number of rows.
  int32_t split_stream = 0;
  const int32_t* fused_jobs = nullptr;
  int32_t num_fused = 0;
  // The jobs with RAW logprobs (SPEC 7) that LaunchRawRows reports on, after the paths. While
  // set, the general algorithm (the fused path's fallback) reports processed logprobs for them;
  // null (the three-launch path): the general algorithm reports raw ones itself.
  const int32_t* raw_jobs = nullptr;
  int32_t num_raw = 0;
  // INVALID_ARGUMENT-style check: returns nullptr when valid, else a message.
  const char* Validate() const;
  // Bytes of `workspace` plus `row_max` for `num_jobs` rows of `vocab_size`.
  [[nodiscard]] static size_t WorkspaceBytes(int32_t num_jobs, int32_t vocab_size);
};

// A launch's configuration as its launcher computes it: what a failed launch reports
// (CudaBackend puts it in the step's INTERNAL error, which the service logs).
struct LaunchConfig {
  const char* kernel;
  dim3 grid;
  dim3 block;
  size_t dynamic_smem;  // bytes
};
LaunchConfig FusedRowsConfig(const StepParams& params);
LaunchConfig SplitRowsConfig(const StepParams& params);
LaunchConfig PrepareRowsConfig(const StepParams& params);
LaunchConfig RowUpdatesConfig(const StepParams& params);
LaunchConfig SampleRowsConfig(const StepParams& params);
LaunchConfig RawRowsConfig(const StepParams& params);

// The fused path (one read of each row; a cluster of blocks per row; rows its candidates
// cannot finish go through the general algorithm in the same launch). Needs
// FusedPathFits(vocab_size).
bool FusedPathFits(int32_t vocab_size);
// Columns of a row each block of a fused-path (or RAW logprobs) cluster holds.
int FusedChunk(int32_t vocab_size);
cudaError_t LaunchFusedRows(const StepParams& params, cudaStream_t stream);

// SPEC 7's RAW logprobs of the jobs in params.raw_jobs, after the split and fused paths have
// sampled them (same stream): the log_softmax of each row as sent, its token's (or prompt
// target's) value and its largest raw logprobs replace the processed ones. A cluster of blocks
// per row holds the row in shared memory. Needs FusedPathFits(vocab_size).
cudaError_t LaunchRawRows(const StepParams& params, cudaStream_t stream);

// Whether a job takes the split path: 1 <= top_k <= kSplitMaxK (and < V), no force top-N,
// at most 2048 candidates in all (chunks * top_k), no top-nσ (its cut needs the whole row's
// deviation before the candidates' mass: the fused path's resident row has it). Needs
// FusedPathFits(vocab_size).
inline bool SplitPathEligible(const RowJob& job, int32_t vocab_size) {
  const int chunks = (vocab_size + kSplitChunk - 1) / kSplitChunk;
  const bool force = job.kind != kRowPrompt && job.force_top_n > 0 && job.force_top_n < vocab_size;
  const bool sigma = job.kind != kRowPrompt && job.top_n_sigma > 0.0f;
  return job.top_k >= 1 && job.top_k <= kSplitMaxK && job.top_k < vocab_size && !force &&
         !sigma && chunks * job.top_k <= 2048;
}
[[nodiscard]] size_t SplitScratchBytes(int32_t num_split, int32_t vocab_size);
cudaError_t LaunchSplitRows(const StepParams& params, cudaStream_t stream);

// SPEC 6's check of the jobs' worker draft rows (RowJob::q_check) into RowResult::draft_fault;
// before the path's launches, on the same stream.
cudaError_t LaunchCheckDraftRows(const StepParams& params, cudaStream_t stream);

// Issue 46: a step's tokens written into the worker's StepOutput area by the device, right
// after the sampling launches, so that the worker's next forward (waiting on the done word)
// never waits for samplerd's host. It applies step_assembly's rules to the launch's results:
// a request fails (-1 in every column, 0 accepted) when it failed before the launch or any of
// its rows, sampled or prompt, has a status or a draft fault; a DECODE request emits its
// accepted drafts then one token; -1 past a request's tokens.
struct OutputRequest {
  int32_t first_job = -1;   // its first sampled job, an index into the launch's results
  int32_t rows = 0;         // its sampled jobs, consecutive
  int32_t prompt_first = 0;  // its prompt jobs [prompt_first, prompt_first + prompt_count)
  int32_t prompt_count = 0;
  int32_t failed = 0;        // failed before the launch (planning, a refusal, the pool)
};

struct OutputParams {
  const RowResult* results = nullptr;      // device, the launch's
  const OutputRequest* requests = nullptr;  // device [num_requests]
  int32_t num_requests = 0;
  int32_t decode = 0;                      // DECODE: accepted prefix, then one token
  int32_t* token_ids = nullptr;            // [num_requests][tokens_per_request], or null
  int32_t tokens_per_request = 1;
  int32_t* num_accepted = nullptr;         // [num_requests], or null
  unsigned int* done_word = nullptr;       // set to done_value after the writes, or null
  unsigned int done_value = 0;
};
cudaError_t LaunchWriteStepOutput(const OutputParams& params, cudaStream_t stream);

cudaError_t LaunchPrepareRows(const StepParams& params, cudaStream_t stream);
cudaError_t LaunchRowUpdates(const StepParams& params, cudaStream_t stream);
cudaError_t LaunchSampleRows(const StepParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_SAMPLING_LAUNCH_H_
