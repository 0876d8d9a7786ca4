#include "pipeline/proto_convert.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "sampler/extent.h"
#include "sampler/status_macros.h"

namespace samplerd {
namespace {

// Where a step's non-inline sources come from, and what bounds the memory it may cause.
struct ConvertContext {
  LogitsSourceResolver* resolver;  // may be null (run-local)
  MemoryBudget* budget;            // may be null: unbounded
  const Limits& limits;
};

// Sharded logits are concatenated into one tensor of at most this many columns.
constexpr int64_t kMaxShardedCols = int64_t{1} << 30;

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, const std::string& field) {
  switch (dtype) {
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    case v1::FLOAT16:
      return DType::kFloat16;
    default:
      return FieldError(field + ".dtype", "required: FLOAT32, BFLOAT16 or FLOAT16");
  }
}

}  // namespace

absl::StatusOr<TensorLayout> TensorLayoutOf(const v1::Tensor& tensor, const std::string& field) {
  TensorLayout layout;
  if (tensor.source_case() == v1::Tensor::kValues) {
    if (tensor.dtype() != v1::DTYPE_UNSPECIFIED && tensor.dtype() != v1::FLOAT32) {
      return FieldError(field + ".dtype", "`values` are float32: dtype must be FLOAT32 or unset");
    }
    layout.dtype = DType::kFloat32;
  } else if (tensor.source_case() != v1::Tensor::SOURCE_NOT_SET) {
    auto dtype = DTypeFromProto(tensor.dtype(), field);
    if (!dtype.ok()) return dtype.status();
    layout.dtype = *dtype;
  }
  layout.row_stride = tensor.row_stride() == 0 ? tensor.cols() : tensor.row_stride();
  auto extent = TensorByteExtent(tensor.rows(), tensor.cols(), layout.row_stride,
                                 DTypeSize(layout.dtype), field);
  if (!extent.ok()) return extent.status();
  layout.byte_extent = *extent;
  return layout;
}

namespace {

// Resolves one Tensor (no shards) to a view. Its byte extent is computed once, checked, and
// every source is checked to hold that many bytes before the view is built.
absl::StatusOr<LogitsView> SingleTensorView(const v1::Tensor& tensor, const std::string& field,
                                            ConvertedStep& holder, const ConvertContext& ctx) {
  auto layout = TensorLayoutOf(tensor, field);
  if (!layout.ok()) return layout.status();
  const int64_t extent = layout->byte_extent;
  LogitsView view;
  view.dtype = layout->dtype;
  view.rows = tensor.rows();
  view.cols = tensor.cols();
  view.row_stride = layout->row_stride;
  switch (tensor.source_case()) {
    case v1::Tensor::kData:
      if (static_cast<int64_t>(tensor.data().size()) < extent) {
        return FieldError(field + ".data",
                       absl::StrCat(tensor.data().size(), " bytes; [", view.rows, ", ", view.cols,
                                    "] ", DTypeName(view.dtype), " with row_stride ",
                                    view.row_stride, " needs ", extent));
      }
      view.data = tensor.data().data();
      return view;
    case v1::Tensor::kValues:
      if (static_cast<int64_t>(tensor.values().values_size()) * 4 < extent) {
        return FieldError(field + ".values",
                       absl::StrCat(tensor.values().values_size(), " values; [", view.rows, ", ",
                                    view.cols, "] with row_stride ", view.row_stride, " needs ",
                                    extent / 4));
      }
      view.data = tensor.values().values().data();
      return view;
    case v1::Tensor::kBuffer:
    case v1::Tensor::kCudaIpc:
    case v1::Tensor::kNccl: {
      if (ctx.resolver == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": buffer, cuda_ipc and nccl sources need a running samplerd server; "
                   "inline `data` or `values` are read here"));
      }
      std::shared_ptr<const void> lease;
      std::function<absl::Status()> verify;
      auto data = ctx.resolver->Resolve(tensor, extent, field, &view.on_device, &lease, &verify);
      if (!data.ok()) return data.status();
      view.data = *data;
      if (lease) holder.leases.push_back(std::move(lease));
      if (verify) holder.verify_after_read.push_back(std::move(verify));
      // A ready_event matters only where the producer is a GPU stream: device views. (Host
      // memory is read after the call arrives, so the producer has finished writing it.)
      if (view.on_device && !tensor.ready_event().empty()) {
        std::shared_ptr<const void> event_lease;
        auto event = ctx.resolver->ResolveReadyEvent(tensor.ready_event(),
                                                     field + ".ready_event", &event_lease);
        if (!event.ok()) return event.status();
        view.ready_event = *event;
        if (event_lease) holder.leases.push_back(std::move(event_lease));
      }
      return view;
    }
    case v1::Tensor::SOURCE_NOT_SET:
      break;
  }
  return FieldError(field, "has no source: set data, values, buffer, cuda_ipc, nccl or shards");
}

// The server's row and column limits on a tensor as the request declares it (the shards'
// columns added up, which a nonzero declared `cols` must equal: INVALID_ARGUMENT), checked before any source is resolved or a byte reserved, allocated or
// copied: a 272-byte request of 16 shards of [1, 2^24] once cost 1 GiB and 4 s before
// planning refused its columns (issue 25). RESOURCE_EXHAUSTED naming the field, as PlanStep
// words it.
absl::Status CheckDeclaredShape(const v1::Tensor& tensor, const std::string& field,
                                const Limits& limits) {
  int64_t cols = tensor.cols();
  int64_t rows = tensor.rows();
  if (tensor.shards_size() > 0) {
    cols = 0;
    rows = tensor.shards(0).rows();
    for (const v1::Tensor& shard : tensor.shards()) cols += shard.cols();  // < 2^31 * 2^31
  }
  if (rows > limits.max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ".rows: ", rows, " exceeds the server limit of ", limits.max_rows));
  }
  if (cols > limits.max_vocab_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ".cols: ", cols, tensor.shards_size() > 0 ? " (the shards' columns added up)" : "",
        " exceeds the server limit of ", limits.max_vocab_size));
  }
  if (tensor.shards_size() > 0 && tensor.cols() != 0 && tensor.cols() != cols) {
    return FieldError(field + ".cols", absl::StrCat(tensor.cols(), " is not the shards' columns added up (",
                                                    cols, "); 0 takes their sum"));
  }
  return absl::OkStatus();
}

// Tensor-parallel shards in device memory (issue 47): one view whose columns the kernels find
// in each shard in place (LogitsView::shards), nothing gathered or copied. Two shards whose
// bytes overlap are refused: a worker's ranks write disjoint memory, so an overlap is a
// client's mistake that would otherwise sample columns twice.
absl::StatusOr<LogitsView> DeviceShardsView(const std::string& field,
                                            const std::vector<LogitsView>& shards) {
  LogitsView out;
  out.dtype = shards[0].dtype;
  out.rows = shards[0].rows;
  out.on_device = true;
  out.data = shards[0].data;
  struct Extent {
    uintptr_t begin, end;
    size_t shard;
  };
  std::vector<Extent> extents;
  int32_t col = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const LogitsView& v = shards[s];
    out.shards.push_back(LogitsShard{v.data, v.row_stride, col, v.cols, v.ready_event});
    col += v.cols;  // <= kMaxShardedCols, checked by the caller
    const auto begin = reinterpret_cast<uintptr_t>(v.data);
    // The extent was checked against the source when the view was built.
    extents.push_back(Extent{begin, begin + static_cast<uintptr_t>(v.ByteExtent()), s});
  }
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].begin < extents[i - 1].end) {
      const size_t a = std::min(extents[i].shard, extents[i - 1].shard);
      const size_t b = std::max(extents[i].shard, extents[i - 1].shard);
      return FieldError(absl::StrCat(field, ".shards[", b, "]"),
                        absl::StrCat("its bytes overlap those of ", field, ".shards[", a, "]"));
    }
  }
  out.cols = col;
  out.row_stride = col;
  return out;
}

// Resolves a Tensor, concatenating tensor-parallel shards along columns into owned storage,
// reserved from the budget before it is allocated.
absl::StatusOr<LogitsView> TensorView(const v1::Tensor& tensor, const std::string& field,
                                      ConvertedStep& holder, const ConvertContext& ctx) {
  if (auto status = CheckDeclaredShape(tensor, field, ctx.limits); !status.ok()) return status;
  if (tensor.shards_size() == 0) return SingleTensorView(tensor, field, holder, ctx);
  if (tensor.source_case() != v1::Tensor::SOURCE_NOT_SET) {
    return FieldError(field, "set either shards or a source, not both");
  }
  std::vector<LogitsView> shards;
  int64_t cols = 0;
  for (int s = 0; s < tensor.shards_size(); ++s) {
    const std::string shard_field = absl::StrCat(field, ".shards[", s, "]");
    if (tensor.shards(s).shards_size() > 0) return FieldError(shard_field, "shards do not nest");
    auto view = SingleTensorView(tensor.shards(s), shard_field, holder, ctx);
    if (!view.ok()) return view.status();
    if (!shards.empty() && view->on_device != shards[0].on_device) {
      return FieldError(shard_field, absl::StrCat("is in ", view->on_device ? "device" : "host",
                                                  " memory and shards[0] is not: every shard must be "
                                                  "in the same kind of memory"));
    }
    if (view->on_device && s >= kMaxDeviceShards) {
      return FieldError(field + ".shards",
                        absl::StrCat("more than ", kMaxDeviceShards, " shards in device memory"));
    }
    if (!shards.empty() && (view->rows != shards[0].rows || view->dtype != shards[0].dtype)) {
      return FieldError(shard_field, "every shard must have the same rows and dtype as shards[0]");
    }
    cols += view->cols;  // at most 2^31 shards of < 2^31 columns: no overflow
    if (cols > kMaxShardedCols) {
      return FieldError(field + ".shards",
                     absl::StrCat("the shards' columns add up to more than ", kMaxShardedCols));
    }
    shards.push_back(*view);
  }
  if (shards[0].on_device) return DeviceShardsView(field, shards);
  LogitsView out;
  out.dtype = shards[0].dtype;
  out.rows = shards[0].rows;
  out.cols = static_cast<int32_t>(cols);
  out.row_stride = cols;
  const int elem = DTypeSize(out.dtype);
  auto bytes = TensorByteExtent(out.rows, cols, cols, elem, field);
  if (!bytes.ok()) return bytes.status();
  if (ctx.budget != nullptr) {
    auto lease = ctx.budget->Reserve(*bytes, field + ".shards");
    if (!lease.ok()) return lease.status();
    holder.leases.push_back(std::move(*lease));
  }
  auto storage = std::make_unique<std::vector<unsigned char>>(static_cast<size_t>(*bytes));
  for (int32_t r = 0; r < out.rows; ++r) {
    unsigned char* dst = storage->data() + static_cast<size_t>(r) * cols * elem;
    for (const LogitsView& shard : shards) {
      std::memcpy(dst, shard.Row(r), static_cast<size_t>(shard.cols) * elem);
      dst += static_cast<size_t>(shard.cols) * elem;
    }
  }
  out.data = storage->data();
  holder.owned.push_back(std::move(storage));
  return out;
}

SamplingParams ParamsFromProto(const v1::SamplingParams& p) {
  SamplingParams out;
  if (p.has_temperature()) out.temperature = p.temperature();
  if (p.has_top_p()) out.top_p = p.top_p();
  if (p.has_top_k()) out.top_k = p.top_k();
  if (p.has_min_p()) out.min_p = p.min_p();
  if (p.has_repetition_penalty()) out.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) out.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) out.frequency_penalty = p.frequency_penalty();
  if (p.has_top_logprobs()) out.top_logprobs = p.top_logprobs();
  if (p.has_seq_seed()) out.seq_seed = p.seq_seed();
  out.allowed_token_ids.assign(p.allowed_token_ids().begin(), p.allowed_token_ids().end());
  out.bad_words.reserve(p.bad_words_size());
  for (const v1::TokenSequence& word : p.bad_words()) {
    out.bad_words.emplace_back(word.token_ids().begin(), word.token_ids().end());
  }
  out.min_tokens = p.min_tokens();
  out.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  // A map: keys are unique; its iteration order is unspecified (validation sorts them).
  out.logit_bias.reserve(p.logit_bias_size());
  for (const auto& [token, bias] : p.logit_bias()) out.logit_bias.emplace_back(token, bias);
  out.dry_multiplier = p.dry_multiplier();
  if (p.has_dry_base()) out.dry_base = p.dry_base();
  if (p.has_dry_allowed_length()) out.dry_allowed_length = p.dry_allowed_length();
  out.dry_sequence_breakers.assign(p.dry_sequence_breakers().begin(),
                                   p.dry_sequence_breakers().end());
  out.dry_range = p.dry_range();
  out.top_n_sigma = p.top_n_sigma();
  out.xtc_probability = p.xtc_probability();
  if (p.has_xtc_threshold()) out.xtc_threshold = p.xtc_threshold();
  out.logprobs_mode = static_cast<int32_t>(p.logprobs_mode());  // checked by NormalizeParams
  return out;
}

template <typename T>
std::vector<T> ToVector(const google::protobuf::RepeatedField<T>& field) {
  return std::vector<T>(field.begin(), field.end());
}

// Converts one request; a fault of its draft tensors is returned, to fail this request only.
absl::Status RequestFromProto(const v1::RequestInputs& in, const std::string& field,
                              ConvertedStep& holder, const ConvertContext& ctx,
                              RequestInputs& out) {
  out.request_id = in.request_id();
  out.params = ParamsFromProto(in.params());
  out.row = in.row();
  out.first_row = in.first_row();
  out.num_rows = in.num_rows();
  out.rows = ToVector(in.rows());
  out.draft_indices = ToVector(in.draft_indices());
  out.sample_position = in.sample_position();
  out.last_valid_offset = in.last_valid_offset();
  out.draft_token_ids = ToVector(in.draft_token_ids());
  out.golden_token_ids = ToVector(in.golden_token_ids());
  out.allowed_token_masks.assign(in.allowed_token_masks().begin(), in.allowed_token_masks().end());
  out.prompt_token_ids = ToVector(in.prompt_token_ids());
  out.output_token_ids = ToVector(in.output_token_ids());
  out.prompt_first_row = in.prompt_first_row();
  out.prompt_targets = ToVector(in.prompt_targets());
  if (in.has_draft_logprobs() && in.has_draft_topn()) {
    return FieldError(field, "set draft_logprobs or draft_topn, not both");
  }
  if (in.has_draft_logprobs()) {
    auto view = TensorView(in.draft_logprobs(), field + ".draft_logprobs", holder, ctx);
    if (!view.ok()) return view.status();
    out.drafts.form = DraftDistributions::Form::kDense;
    out.drafts.values = *view;
  } else if (in.has_draft_topn()) {
    auto view = TensorView(in.draft_topn().values(), field + ".draft_topn.values", holder, ctx);
    if (!view.ok()) return view.status();
    out.drafts.form = DraftDistributions::Form::kTopN;
    out.drafts.values = *view;
    out.drafts.token_ids = ToVector(in.draft_topn().token_ids());
  }
  // A device tensor (a CUDA IPC slice or one-off handle, issue 47) is read in place by the
  // CUDA backend's kernels after its ready_event; the CPU backend fails the request.
  return absl::OkStatus();
}

// Little-endian arrays of a RequestBatch: `bytes` holds B elements of T (B = `count`, or taken
// from the first array when count < 0); empty = absent.
template <typename T>
absl::StatusOr<std::vector<T>> BatchArray(const std::string& bytes, int64_t count,
                                          const std::string& field) {
  std::vector<T> out;
  if (bytes.empty()) return out;
  if (bytes.size() % sizeof(T) != 0 ||
      (count >= 0 && static_cast<int64_t>(bytes.size() / sizeof(T)) != count)) {
    return FieldError(field, absl::StrCat("holds ", bytes.size(), " bytes: expected ",
                                          count >= 0 ? absl::StrCat(count) : "B", " elements of ",
                                          sizeof(T), " bytes"));
  }
  out.resize(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());  // little-endian hosts only (x86, arm)
  return out;
}

// Expands a RequestBatch into its B requests (issue 46), B bounded by max_requests before
// anything is allocated.
absl::Status BatchFromProto(const v1::RequestBatch& batch, StepKind kind, const Limits& limits,
                            std::vector<RequestInputs>& requests) {
  const std::string field = "inputs.batch";
  if (kind == StepKind::kDraft) {
    return FieldError(field, "DRAFT steps name their rows per request: use requests");
  }
  if (batch.rows().empty()) return FieldError(field + ".rows", "required: int32 per request");
  const int64_t count = static_cast<int64_t>(batch.rows().size() / sizeof(int32_t));
  if (count > limits.max_requests) {
    return FieldError(field + ".rows", absl::StrCat(count, " requests exceed the server's ",
                                                    limits.max_requests, " a step"));
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> rows, BatchArray<int32_t>(batch.rows(), -1, field + ".rows"));
  ASSIGN_OR_RETURN(std::vector<int32_t> num_rows,
                   BatchArray<int32_t>(batch.num_rows(), count, field + ".num_rows"));
  ASSIGN_OR_RETURN(std::vector<int64_t> positions,
                   BatchArray<int64_t>(batch.sample_positions(), count,
                                       field + ".sample_positions"));
  ASSIGN_OR_RETURN(std::vector<uint64_t> seeds,
                   BatchArray<uint64_t>(batch.seq_seeds(), count, field + ".seq_seeds"));
  if (kind == StepKind::kPrefill && !num_rows.empty()) {
    return FieldError(field + ".num_rows", "is for DECODE steps");
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> param_index,
                   BatchArray<int32_t>(batch.param_index(), count, field + ".param_index"));
  std::vector<SamplingParams> sets;
  if (batch.param_sets_size() > 0) {
    if (batch.has_params()) {
      return FieldError(field + ".param_sets", "set either params or param_sets, not both");
    }
    if (param_index.empty()) {
      return FieldError(field + ".param_index", "required with param_sets: int32 per request");
    }
    for (const v1::SamplingParams& p : batch.param_sets()) sets.push_back(ParamsFromProto(p));
    for (int64_t i = 0; i < count; ++i) {
      if (param_index[i] < 0 || param_index[i] >= batch.param_sets_size()) {
        return FieldError(field + ".param_index",
                          absl::StrCat("entry ", i, " is ", param_index[i], ": not one of the ",
                                       batch.param_sets_size(), " param_sets"));
      }
    }
  } else {
    if (!param_index.empty()) return FieldError(field + ".param_index", "needs param_sets");
    sets.push_back(ParamsFromProto(batch.params()));
  }
  requests.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    RequestInputs& r = requests[i];
    r.request_id = absl::StrCat(batch.request_id_prefix(), i);
    r.params = sets[param_index.empty() ? 0 : param_index[i]];
    if (!seeds.empty()) r.params.seq_seed = seeds[i];
    if (kind == StepKind::kPrefill) {
      r.row = rows[i];
    } else {
      r.first_row = rows[i];
      r.num_rows = num_rows.empty() ? 1 : num_rows[i];
    }
    if (!positions.empty()) r.sample_position = positions[i];
  }
  return absl::OkStatus();
}

// The tokens a request can emit: the stride StepOutput.token_ids needs.
int64_t MaxTokensOf(const RequestInputs& r, StepKind kind) {
  switch (kind) {
    case StepKind::kPrefill:
      return 1;
    case StepKind::kDecode:
      return std::max<int64_t>(1, r.num_rows);
    case StepKind::kDraft:
      return std::max<int64_t>(1, static_cast<int64_t>(r.rows.size()));
  }
  return 1;
}

// Resolves a StepOutput's slices against the caller's output regions (writable device memory,
// bounds-checked) and its done event.
absl::Status OutputFromProto(const v1::StepOutput& in, Step& step, ConvertedStep& holder,
                             const ConvertContext& ctx) {
  const std::string field = "output";
  if (ctx.resolver == nullptr) {
    return absl::FailedPreconditionError(
        "output: writing tokens into device memory needs samplerd's CUDA backend");
  }
  StepOutputTarget& out = step.output;
  const int64_t requests = static_cast<int64_t>(step.requests.size());
  if (in.tokens_per_request() < 0 || in.tokens_per_request() > ctx.limits.max_rows) {
    return FieldError(field + ".tokens_per_request",
                      absl::StrCat(in.tokens_per_request(), " is outside [0, ",
                                   ctx.limits.max_rows, "] (0 = 1; no request emits more tokens "
                                   "than the server's rows a step)"));
  }
  out.tokens_per_request = std::max(1, in.tokens_per_request());
  auto slice = [&](const v1::BufferSlice& s, int64_t bytes,
                   const std::string& name) -> absl::StatusOr<void*> {
    std::shared_ptr<const void> lease;
    ASSIGN_OR_RETURN(void* data, ctx.resolver->ResolveOutput(s, bytes, field + "." + name, &lease));
    holder.leases.push_back(std::move(lease));
    return data;
  };
  if (in.has_token_ids()) {
    for (int64_t i = 0; i < requests; ++i) {
      const int64_t need = MaxTokensOf(step.requests[i], step.kind);
      if (need > out.tokens_per_request) {
        return FieldError(field + ".tokens_per_request",
                          absl::StrCat(out.tokens_per_request, " is fewer than the ", need,
                                       " tokens requests[", i, "] can emit"));
      }
    }
    int64_t bytes = 0;  // requests <= 2^31, tokens_per_request < 2^31: checked anyway
    if (!CheckedMul(requests, out.tokens_per_request, &bytes) ||
        !CheckedMul(bytes, static_cast<int64_t>(sizeof(int32_t)), &bytes)) {
      return FieldError(field + ".tokens_per_request", "the token area's size overflows");
    }
    if (bytes > 0) {
      ASSIGN_OR_RETURN(out.token_ids, slice(in.token_ids(), bytes, "token_ids"));
    }
  }
  if (in.has_num_accepted() && requests > 0) {
    ASSIGN_OR_RETURN(out.num_accepted,
                     slice(in.num_accepted(), requests * int64_t{sizeof(int32_t)}, "num_accepted"));
  }
  if (in.has_done_word()) {
    ASSIGN_OR_RETURN(out.done_word, slice(in.done_word(), sizeof(uint32_t), "done_word"));
    out.done_value = in.done_value();
  }
  if (!in.done_event().empty()) {
    std::shared_ptr<const void> lease;
    ASSIGN_OR_RETURN(out.done_event,
                     ctx.resolver->ResolveReadyEvent(in.done_event(), field + ".done_event", &lease));
    holder.leases.push_back(std::move(lease));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConvertedStep>> StepFromProto(const v1::SampleRequest& request,
                                                             LogitsSourceResolver* resolver,
                                                             MemoryBudget* budget,
                                                             const Limits& limits) {
  const ConvertContext ctx{resolver, budget, limits};
  auto converted = std::make_unique<ConvertedStep>();
  Step& step = converted->step;
  const v1::SamplerInputs& inputs = request.inputs();
  step.step_id = request.step_id();
  switch (inputs.kind()) {
    case v1::PREFILL:
      step.kind = StepKind::kPrefill;
      break;
    case v1::DECODE:
      step.kind = StepKind::kDecode;
      break;
    case v1::DRAFT:
      step.kind = StepKind::kDraft;
      break;
    default:
      return FieldError("inputs.kind", "required: PREFILL, DECODE or DRAFT");
  }
  step.vocab_size = inputs.vocab_size();
  step.force_top_n = inputs.force_top_n();
  step.compute_sum_smaller_probs = inputs.compute_sum_smaller_probs();
  if (!request.has_logits()) return FieldError("logits", "required");
  auto logits = TensorView(request.logits(), "logits", *converted, ctx);
  if (!logits.ok()) return logits.status();
  step.logits = *logits;
  if (inputs.has_batch()) {
    if (inputs.requests_size() > 0) {
      return FieldError("inputs.batch", "set either requests or batch, not both");
    }
    RETURN_IF_ERROR(BatchFromProto(inputs.batch(), step.kind, limits, step.requests));
    converted->request_faults.resize(step.requests.size());
  } else {
    step.requests.resize(inputs.requests_size());
    converted->request_faults.resize(inputs.requests_size());
    for (int i = 0; i < inputs.requests_size(); ++i) {
      converted->request_faults[i] =
          RequestFromProto(inputs.requests(i), absl::StrCat("requests[", i, "]"), *converted,
                           ctx, step.requests[i]);
    }
  }
  if (request.has_output()) {
    RETURN_IF_ERROR(OutputFromProto(request.output(), step, *converted, ctx));
  }
  return converted;
}

absl::StatusOr<void*> LogitsSourceResolver::ResolveOutput(const v1::BufferSlice& /*slice*/,
                                                          int64_t /*byte_extent*/,
                                                          const std::string& field,
                                                          std::shared_ptr<const void>* /*lease*/) {
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": writing tokens into device memory needs samplerd's CUDA backend and a region "
             "registered for output"));
}

absl::Status ConvertedStep::VerifyAfterRead() const {
  for (const auto& verify : verify_after_read) {
    absl::Status status = verify();
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<StepPlan> PlanConvertedStep(const ConvertedStep& converted, const Limits& limits,
                                           const SeedSource& seed_source) {
  auto plan = PlanStep(converted.step, limits, seed_source);
  if (!plan.ok()) return plan.status();
  for (size_t i = 0; i < plan->requests.size(); ++i) {
    if (!converted.request_faults[i].ok()) {
      plan->requests[i].status = converted.request_faults[i];
      plan->requests[i].sampled_rows.clear();
    }
  }
  return plan;
}

namespace {

template <typename T>
void AppendBytes(std::string* out, const T* data, size_t count) {
  out->append(reinterpret_cast<const char*>(data), count * sizeof(T));  // little-endian hosts
}

void PackedResultsToProto(const StepResult& result, v1::PackedResults* out) {
  size_t k = 0;
  bool named = false;
  for (const RequestResult& r : result.results) {
    for (const TopLogprobs& top : r.top_logprobs) k = std::max(k, top.token_ids.size());
    named = named || !r.request_id.empty();
  }
  out->set_top_logprobs(static_cast<int32_t>(k));
  std::vector<int32_t> codes, counts, accepted, prompt_counts;
  std::vector<uint64_t> seeds;
  for (const RequestResult& r : result.results) {
    codes.push_back(static_cast<int32_t>(r.status.code()));  // absl and gRPC codes coincide
    if (!r.status.ok()) out->add_errors(std::string(r.status.message()));
    counts.push_back(static_cast<int32_t>(r.token_ids.size()));
    accepted.push_back(r.num_accepted);
    prompt_counts.push_back(static_cast<int32_t>(r.prompt_logprobs.size()));
    seeds.push_back(r.seq_seed);
    if (named) out->add_request_ids(r.request_id);
    AppendBytes(out->mutable_token_ids(), r.token_ids.data(), r.token_ids.size());
    AppendBytes(out->mutable_logprobs(), r.logprobs.data(), r.logprobs.size());
    AppendBytes(out->mutable_sum_smaller_probs(), r.sum_smaller_probs.data(),
                r.sum_smaller_probs.size());
    AppendBytes(out->mutable_prompt_logprobs(), r.prompt_logprobs.data(),
                r.prompt_logprobs.size());
    if (k == 0) continue;
    for (size_t t = 0; t < r.token_ids.size(); ++t) {
      std::vector<int32_t> ids(k, -1);
      std::vector<float> values(k, -std::numeric_limits<float>::infinity());
      if (t < r.top_logprobs.size()) {
        std::copy(r.top_logprobs[t].token_ids.begin(), r.top_logprobs[t].token_ids.end(),
                  ids.begin());
        std::copy(r.top_logprobs[t].logprobs.begin(), r.top_logprobs[t].logprobs.end(),
                  values.begin());
      }
      AppendBytes(out->mutable_top_token_ids(), ids.data(), k);
      AppendBytes(out->mutable_top_token_logprobs(), values.data(), k);
    }
  }
  AppendBytes(out->mutable_status_codes(), codes.data(), codes.size());
  AppendBytes(out->mutable_token_counts(), counts.data(), counts.size());
  AppendBytes(out->mutable_num_accepted(), accepted.data(), accepted.size());
  AppendBytes(out->mutable_prompt_counts(), prompt_counts.data(), prompt_counts.size());
  AppendBytes(out->mutable_seq_seeds(), seeds.data(), seeds.size());
}

}  // namespace

void ResultToProto(const StepResult& result, v1::SampleResponse* response, bool packed) {
  response->set_step_id(result.step_id);
  if (packed) {
    PackedResultsToProto(result, response->mutable_packed());
    return;
  }
  for (const RequestResult& r : result.results) {
    v1::RequestResult* out = response->add_results();
    out->set_request_id(r.request_id);
    if (!r.status.ok()) {
      // absl::StatusCode and gRPC's numeric codes coincide.
      out->mutable_status()->set_code(static_cast<int32_t>(r.status.code()));
      out->mutable_status()->set_message(std::string(r.status.message()));
    }
    out->set_seq_seed(r.seq_seed);
    out->mutable_token_ids()->Add(r.token_ids.begin(), r.token_ids.end());
    out->set_num_accepted(r.num_accepted);
    out->mutable_logprobs()->Add(r.logprobs.begin(), r.logprobs.end());
    for (const TopLogprobs& top : r.top_logprobs) {
      v1::TopLogprobs* t = out->add_top_logprobs();
      t->mutable_token_ids()->Add(top.token_ids.begin(), top.token_ids.end());
      t->mutable_logprobs()->Add(top.logprobs.begin(), top.logprobs.end());
    }
    out->mutable_sum_smaller_probs()->Add(r.sum_smaller_probs.begin(), r.sum_smaller_probs.end());
    out->mutable_prompt_logprobs()->Add(r.prompt_logprobs.begin(), r.prompt_logprobs.end());
  }
}

}  // namespace samplerd
