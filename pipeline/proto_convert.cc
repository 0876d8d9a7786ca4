#include "pipeline/proto_convert.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "sampler/extent.h"

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
// columns added up), checked before any source is resolved or a byte reserved, allocated or
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
  return absl::OkStatus();
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
    if (view->on_device) {
      return absl::FailedPreconditionError(
          absl::StrCat(shard_field, ": device-memory shards are not supported yet"));
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
  if (out.drafts.form != DraftDistributions::Form::kPool && out.drafts.values.on_device) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": draft distributions in device memory are not supported yet"));
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
  step.requests.resize(inputs.requests_size());
  converted->request_faults.resize(inputs.requests_size());
  for (int i = 0; i < inputs.requests_size(); ++i) {
    converted->request_faults[i] =
        RequestFromProto(inputs.requests(i), absl::StrCat("requests[", i, "]"), *converted,
                         ctx, step.requests[i]);
  }
  return converted;
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

void ResultToProto(const StepResult& result, v1::SampleResponse* response) {
  response->set_step_id(result.step_id);
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
