#include "sampler/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "sampler/dtype.h"
#include "sampler/spec_rules.h"
#include "sampler/row_kernels.h"
#include "sampler/row_processor.h"
#include "sampler/step_assembly.h"

namespace samplerd {
namespace {

// The draft model's processed distribution q_j of one verify row (SPEC section 6). Values are
// read on demand: verification looks at q(d) and, after a rejection, q over the target's kept
// tokens only, so a dense [q - 1, V] draft tensor is never read in full.
class DraftRowView {
 public:
  // Dense, from a sent tensor: row `row` of `view` (V columns used).
  static DraftRowView Dense(const LogitsView& view, int32_t row) {
    DraftRowView out;
    out.view_ = view;
    out.view_row_ = row;
    return out;
  }
  // Dense or sparse, from float storage (the pool, or a loaded top-N row).
  static DraftRowView Values(const float* logprobs, const int32_t* token_ids, int32_t n) {
    DraftRowView out;
    out.logprobs_ = logprobs;
    out.token_ids_ = token_ids;
    out.n_ = n;
    return out;
  }

  // The draft logprob of `token` (-inf when the draft's top-N does not hold it).
  float Logprob(int32_t token) const {
    if (view_.data != nullptr) {
      float value;
      LoadRowAsFloat(view_, view_row_, token, 1, &value);
      return value;
    }
    if (token_ids_ == nullptr) return logprobs_[token];
    for (int32_t i = 0; i < n_; ++i) {
      if (token_ids_[i] == token) return logprobs_[i];
    }
    return -std::numeric_limits<float>::infinity();
  }

 private:
  LogitsView view_;  // data == nullptr unless dense-from-tensor
  int32_t view_row_ = 0;
  const float* logprobs_ = nullptr;
  const int32_t* token_ids_ = nullptr;  // null = dense
  int32_t n_ = 0;
};

}  // namespace

struct CpuBackend::Worker {
  RowProcessor processor;
  std::vector<float> draft_values;    // one sent top-N draft row, as float
};

namespace {

// Resolves q_j for verify row j of a DECODE request; a sent top-N row is loaded into `buffer`.
DraftRowView ResolveDraftRow(const RequestInputs& inputs, int32_t j, const DraftPool::Entry* entry,
                             std::vector<float>& buffer) {
  const DraftDistributions& drafts = inputs.drafts;
  switch (drafts.form) {
    case DraftDistributions::Form::kPool: {
      const DraftRow& row = entry->at(j + 1);  // presence checked when the entry was taken
      return DraftRowView::Values(row.logprobs.data(),
                                  row.token_ids.empty() ? nullptr : row.token_ids.data(),
                                  static_cast<int32_t>(row.token_ids.size()));
    }
    case DraftDistributions::Form::kDense:
      return DraftRowView::Dense(drafts.values, j);
    case DraftDistributions::Form::kTopN: {
      const int32_t n = drafts.values.cols;
      buffer.resize(n);
      LoadRowAsFloat(drafts.values, j, 0, n, buffer.data());
      return DraftRowView::Values(buffer.data(),
                                  drafts.token_ids.data() + static_cast<size_t>(j) * n, n);
    }
  }
  return DraftRowView::Values(nullptr, nullptr, 0);
}

// q(x) = exp(draft logprob), exactly as sent. PlanStep and TakeDecodeDrafts have refused rows
// holding NaN or +inf (SPEC 6, CheckDraftRow); a client that rewrites its own shm region after
// that gets a NaN q, which rejects (AcceptDraft) and adds nothing to a residual (max(0, NaN)
// is 0): its own garbage, never a read outside the region.
double DraftProbability(const DraftRowView& q_row, int32_t token) {
  return std::exp(static_cast<double>(q_row.Logprob(token)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuBackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads: ", options.num_threads, " must be >= 0 (0 = all cores)"));
  }
  int threads = options.num_threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<CpuBackend>(new CpuBackend(options, threads));
}

CpuBackend::CpuBackend(const CpuBackendOptions& options, int num_threads)
    : num_threads_(num_threads), draft_pool_(options.draft_pool), pool_(num_threads) {
  for (int w = 0; w < pool_.NumWorkers(); ++w) workers_.push_back(std::make_unique<Worker>());
}

CpuBackend::~CpuBackend() = default;

BackendInfo CpuBackend::Info() const {
  return BackendInfo{"cpu", absl::StrCat(num_threads_, " threads")};
}

absl::StatusOr<StepResult> CpuBackend::Sample(const StepPlan& plan) {
  if (plan.step->logits.on_device) {
    return absl::FailedPreconditionError("logits: device memory needs the CUDA backend");
  }
  if (plan.step->output.any()) {
    return absl::FailedPreconditionError("output: device memory needs the CUDA backend");
  }
  absl::MutexLock lock(&mu_);
  const Step& step = *plan.step;
  const size_t num_requests = plan.requests.size();
  StepResult result = BeginStepResult(plan);
  std::vector<std::string> fields(num_requests);
  for (size_t i = 0; i < num_requests; ++i) fields[i] = RequestField(i);
  // Draft rows in device memory (issue 47) fail their own request, as device logits fail the
  // step: this backend reads host memory only.
  for (size_t i = 0; i < num_requests; ++i) {
    const DraftDistributions& drafts = step.requests[i].drafts;
    if (drafts.form != DraftDistributions::Form::kPool && drafts.values.on_device &&
        result.results[i].status.ok()) {
      result.results[i].status = absl::FailedPreconditionError(absl::StrCat(
          fields[i], drafts.form == DraftDistributions::Form::kDense ? ".draft_logprobs"
                                                                     : ".draft_topn.values",
          ": device memory needs the CUDA backend"));
    }
  }
  // DECODE requests that verify against the pool take their drafts now (consuming them).
  std::vector<DraftPool::Entry> pool_entries;
  TakeDecodeDrafts(plan, draft_pool_, result, &pool_entries);
  const std::vector<RowTask> tasks = RowTasks(plan, result);
  std::vector<RowOutcome> outcomes(tasks.size());
  pool_.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t t, int w) {
    const RowTask& task = tasks[t];
    const RequestPlan& request = plan.requests[task.request];
    const RequestInputs& inputs = *request.inputs;
    const SampledRow& row = request.sampled_rows[task.index];
    Worker& worker = *workers_[w];
    RowProcessor& proc = worker.processor;
    RowOutcome& out = outcomes[t];
    const std::string& field = fields[task.request];
    const bool is_verify =
        step.kind == StepKind::kDecode && task.index < inputs.num_rows - 1;

    RowOptions options;
    options.params = &request.params;
    options.vocab_size = step.vocab_size;
    options.force_top_n = step.force_top_n;
    options.mask = row.mask;
    options.field = field.c_str();
    if (request.params.xtc_probability > 0.0f) options.xtc_u = XtcUniform(request.seed, row.position);
    options.keep_raw = request.params.raw_logprobs;
    // SPEC 3 steps 2b-d and 3 against the row's history (a DECODE row j's includes the drafts
    // of rows 0..j-1).
    const std::shared_ptr<const std::vector<TokenUpdate>> updates =
        request.RowUpdates(step.kind, task.index);
    if (updates != nullptr) options.updates = *updates;
    out.status = proc.Process(step.logits, row.row, options);
    if (!out.status.ok()) return;

    if (is_verify) {
      const int32_t draft = inputs.draft_token_ids[task.index];
      const DraftRowView q_row = ResolveDraftRow(inputs, task.index, &pool_entries[task.request],
                                                 worker.draft_values);
      if (row.golden != -1) {
        // Teacher forcing: accept iff the draft is the golden token; emit the golden token.
        out.accepted = draft == row.golden;
        out.token = row.golden;
      } else {
        const double q = draft >= 0 ? DraftProbability(q_row, draft) : 0.0;
        const double p = draft >= 0 ? proc.Probability(draft) : 0.0;
        const double u = UniformDouble(request.seed,
                                       SequenceNumber(row.position, DrawCase::kAcceptReject));
        out.accepted = AcceptDraft(draft, u, p, q);
        if (out.accepted) {
          out.token = draft;
        } else {
          // The replacement: from max(0, p - q) renormalised; from p when that is empty.
          const double u_replace =
              UniformDouble(request.seed, SequenceNumber(row.position, DrawCase::kReplacement));
          out.token = proc.DrawFromKeptWeights(
              [&](int32_t x, double p_x) {
                return std::max(0.0, p_x - DraftProbability(q_row, x));
              },
              u_replace);
          if (out.token < 0) out.token = proc.Draw(u_replace);
        }
      }
    } else if (row.golden != -1) {
      out.token = row.golden;
    } else {
      out.token = proc.Draw(
          UniformDouble(request.seed, SequenceNumber(row.position, DrawCase::kFresh)));
    }
    // SPEC 7: what is reported (processed or raw); the draw and the pool row are processed.
    const bool raw = request.params.raw_logprobs;
    out.logprob = raw ? proc.RawLogprob(out.token) : proc.Logprob(out.token);
    if (request.params.top_logprobs > 0) {
      if (raw) {
        proc.RawTop(request.params.top_logprobs, &out.top);
      } else {
        proc.Top(request.params.top_logprobs, &out.top);
      }
    }
    if (step.compute_sum_smaller_probs) out.sum_smaller = proc.SumSmallerProbs(out.token);

    if (step.kind == StepKind::kDraft) {
      const std::vector<int32_t>& top_n = proc.ForceTopNIds();
      if (!top_n.empty()) {
        out.draft_row.token_ids = top_n;
        out.draft_row.logprobs.resize(top_n.size());
        for (size_t i = 0; i < top_n.size(); ++i) out.draft_row.logprobs[i] = proc.Logprob(top_n[i]);
      } else {
        out.draft_row.logprobs.resize(step.vocab_size);
        for (int32_t x = 0; x < step.vocab_size; ++x) out.draft_row.logprobs[x] = proc.Logprob(x);
      }
    }
  });

  // Prompt logprobs (PREFILL): SPEC 3 steps 1, 5, 6, 7 only, in chunks of bounded size.
  std::vector<std::vector<float>> prompt_logprobs(num_requests);
  if (step.kind == StepKind::kPrefill) {
    std::vector<RowTask> prompt_tasks;  // index: into prompt_targets
    for (size_t i = 0; i < num_requests; ++i) {
      if (!result.results[i].status.ok()) continue;
      const auto& targets = step.requests[i].prompt_targets;
      prompt_logprobs[i].resize(targets.size());
      for (size_t k = 0; k < targets.size(); ++k) {
        prompt_tasks.push_back(RowTask{static_cast<int32_t>(i), static_cast<int32_t>(k)});
      }
    }
    std::vector<absl::Status> statuses;
    for (size_t start = 0; start < prompt_tasks.size(); start += kPromptLogprobChunkRows) {
      const size_t count = std::min<size_t>(kPromptLogprobChunkRows, prompt_tasks.size() - start);
      statuses.assign(count, absl::OkStatus());
      pool_.ParallelFor(static_cast<int64_t>(count), [&](int64_t c, int w) {
        const RowTask& task = prompt_tasks[start + c];
        const RequestInputs& inputs = step.requests[task.request];
        RowOptions options;
        options.params = &plan.requests[task.request].params;
        options.vocab_size = step.vocab_size;
        options.prompt_mode = true;
        options.keep_raw = options.params->raw_logprobs;
        options.field = fields[task.request].c_str();
        RowProcessor& proc = workers_[w]->processor;
        statuses[c] = proc.Process(step.logits, inputs.prompt_first_row + task.index, options);
        if (statuses[c].ok()) {
          const int32_t target = inputs.prompt_targets[task.index];
          prompt_logprobs[task.request][task.index] =
              options.keep_raw ? proc.RawLogprob(target) : proc.Logprob(target);
        }
      });
      for (size_t c = 0; c < count; ++c) {
        RequestResult& out = result.results[prompt_tasks[start + c].request];
        if (!statuses[c].ok() && out.status.ok()) out.status = statuses[c];
      }
    }
  }

  AssembleStepResult(plan, tasks, outcomes, prompt_logprobs, draft_pool_, result);
  return result;
}

}  // namespace samplerd
