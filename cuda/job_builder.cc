#include "cuda/job_builder.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sampler/dtype.h"
#include "sampler/spec_rules.h"

namespace samplerd {
namespace cuda {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The device form of a row's token updates (sampler/token_updates.h): each entry with its
// request's penalty settings.
std::vector<RowUpdate> DeviceUpdates(const std::vector<TokenUpdate>& updates,
                                     const PenaltySettings& penalties) {
  std::vector<RowUpdate> out;
  out.reserve(updates.size());
  for (const TokenUpdate& u : updates) out.push_back(RowUpdate{u, penalties});
  return out;
}

// The dense draft distribution q of sampled row `index` of a DECODE request, built on the host
// from a sent dense or top-N tensor or a host pool row. PlanStep and TakeDecodeDrafts have
// refused rows holding NaN or +inf (SPEC 6, CheckDraftRow), the same rule as on the CPU.
std::vector<float> HostDraftRow(const DraftDistributions& d, const DraftRow* pooled,
                                int32_t index, int32_t V) {
  std::vector<float> q(V, kNegInf);
  if (d.form == DraftDistributions::Form::kDense) {
    LoadRowAsFloat(d.values, index, V, q.data());
  } else if (d.form == DraftDistributions::Form::kTopN) {
    const int32_t n = d.values.cols;
    std::vector<float> values(n);
    LoadRowAsFloat(d.values, index, n, values.data());
    for (int32_t i = 0; i < n; ++i) {
      const int32_t t = d.token_ids[static_cast<size_t>(index) * n + i];
      if (t >= 0 && q[t] == kNegInf) q[t] = values[i];  // the first occurrence counts
    }
  } else if (pooled->token_ids.empty()) {
    std::copy(pooled->logprobs.begin(), pooled->logprobs.end(), q.begin());
  } else {
    for (size_t i = 0; i < pooled->token_ids.size(); ++i) {
      const int32_t t = pooled->token_ids[i];
      if (t >= 0 && t < V && q[t] == kNegInf) q[t] = pooled->logprobs[i];
    }
  }
  return q;
}

}  // namespace

StepJobs BuildStepJobs(const StepPlan& plan, const std::vector<RowTask>& tasks,
                       const std::vector<DraftPool::Entry>& pool_entries, DeviceDraftStore& store,
                       StepResult& result) {
  const Step& step = *plan.step;
  const int32_t V = step.vocab_size;
  StepJobs out;
  for (const RowTask& task : tasks) {
    const RequestPlan& request = plan.requests[task.request];
    const RequestInputs& inputs = *request.inputs;
    const SampledRow& row = request.sampled_rows[task.index];
    HostJob h;
    RowJob& j = h.job;
    j = RowJob{};
    j.logits_row = row.row;
    j.temperature = request.params.temperature;
    j.top_p = request.params.top_p;
    j.top_k = request.params.top_k;
    j.min_p = request.params.min_p;
    j.top_logprobs = std::min(request.params.top_logprobs, kMaxTopLogprobs);
    j.force_top_n = step.force_top_n;
    j.golden = row.golden;
    j.draft_token = -1;
    j.target = -1;
    j.want_sum_smaller = step.compute_sum_smaller_probs ? 1 : 0;
    j.seed = request.seed;
    j.position = row.position;
    // Issue 50: XTC's draw is decided here, keyed as the CPU keys it (XtcUniform).
    j.top_n_sigma = request.params.top_n_sigma;
    j.xtc = request.params.xtc_probability > 0.0f &&
            XtcUniform(request.seed, row.position) < request.params.xtc_probability;
    j.xtc_threshold = request.params.xtc_threshold;
    j.raw_logprobs = request.params.raw_logprobs ? 1 : 0;
    h.request = task.request;
    h.index = task.index;
    h.mask = row.mask;
    const bool verify = step.kind == StepKind::kDecode && task.index < inputs.num_rows - 1;
    j.kind = verify ? kRowVerify : kRowFresh;
    const std::shared_ptr<const std::vector<TokenUpdate>> updates =
        request.RowUpdates(step.kind, task.index);
    if (updates != nullptr) h.updates = DeviceUpdates(*updates, request.params.Penalties());
    if (verify) {
      j.draft_token = inputs.draft_token_ids[task.index];
      const DraftDistributions& d = inputs.drafts;
      const DraftRow* pooled = d.form == DraftDistributions::Form::kPool
                                   ? &pool_entries[task.request].at(task.index + 1)
                                   : nullptr;
      j.q_dtype = DType::kFloat32;
      if (pooled != nullptr && pooled->device != nullptr) {
        // This backend's own DRAFT output, still on the device: read in place. The kernel
        // wrote -inf or finite processed logprobs, so there is nothing to check.
        j.q_values = pooled->device->data;
      } else if (pooled == nullptr && d.values.on_device) {
        // A worker's tensor (issue 47): read in place in its own dtype, after its ready event
        // (RunOnLane). Its rows are the worker's, not ours: SPEC 6's rule is applied to each
        // on the device (CheckDraftRows) before its request is answered.
        j.q_values = d.values.Row(task.index);
        j.q_dtype = d.values.dtype;
        j.q_check = 1;
        if (d.form == DraftDistributions::Form::kTopN) {
          j.q_n = d.values.cols;
          h.q_ids = d.token_ids.data() + static_cast<size_t>(task.index) * j.q_n;
        }
      } else {
        h.q_host = static_cast<int32_t>(out.q_rows.size());
        out.q_rows.push_back(HostDraftRow(d, pooled, task.index, V));
      }
    }
    h.draft_out = step.kind == StepKind::kDraft;
    if (h.draft_out && result.results[task.request].status.ok()) {
      auto pool_row = store.Allocate(V);
      if (pool_row.ok()) {
        h.pool_row = *std::move(pool_row);
      } else {
        result.results[task.request].status =
            absl::Status(pool_row.status().code(), absl::StrCat(RequestField(task.request), ": ",
                                                                pool_row.status().message()));
      }
    }
    out.jobs.push_back(std::move(h));
  }
  out.num_sampled = out.jobs.size();
  if (step.kind != StepKind::kPrefill) return out;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    if (!result.results[i].status.ok()) continue;
    const RequestPlan& request = plan.requests[i];
    const RequestInputs& inputs = *request.inputs;
    for (size_t k = 0; k < inputs.prompt_targets.size(); ++k) {
      HostJob h;
      RowJob& j = h.job;
      j = RowJob{};
      j.logits_row = inputs.prompt_first_row + static_cast<int32_t>(k);
      j.kind = kRowPrompt;
      j.temperature = request.params.temperature;
      j.top_p = request.params.top_p;
      j.top_k = request.params.top_k;
      j.golden = -1;
      j.draft_token = -1;
      j.target = inputs.prompt_targets[k];
      j.raw_logprobs = request.params.raw_logprobs ? 1 : 0;
      h.request = static_cast<int32_t>(i);
      h.index = static_cast<int32_t>(k);
      out.jobs.push_back(std::move(h));
    }
  }
  return out;
}

}  // namespace cuda
}  // namespace samplerd
