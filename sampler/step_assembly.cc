#include "sampler/step_assembly.h"

#include "absl/strings/str_cat.h"

namespace samplerd {

std::string RequestField(size_t index) { return absl::StrCat("requests[", index, "]"); }

StepResult BeginStepResult(const StepPlan& plan) {
  const Step& step = *plan.step;
  StepResult result;
  result.step_id = step.step_id;
  result.results.resize(plan.requests.size());
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    RequestResult& out = result.results[i];
    out.request_id = step.requests[i].request_id;
    out.seq_seed = plan.requests[i].params.seq_seed;
    out.status = plan.requests[i].status;
  }
  return result;
}

void TakeDecodeDrafts(const StepPlan& plan, DraftPool& pool, StepResult& result,
                      std::vector<DraftPool::Entry>* entries) {
  const Step& step = *plan.step;
  entries->assign(plan.requests.size(), {});
  if (step.kind != StepKind::kDecode) return;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const RequestInputs& inputs = step.requests[i];
    if (!result.results[i].status.ok() || inputs.num_rows < 2 ||
        inputs.drafts.form != DraftDistributions::Form::kPool) {
      continue;
    }
    const std::string field = RequestField(i);
    auto entry = pool.Take(DraftPoolKey(step.pool_scope, inputs.request_id));
    if (!entry.ok()) {
      result.results[i].status =
          absl::FailedPreconditionError(absl::StrCat(field, ": ", entry.status().message()));
      continue;
    }
    absl::Status status;
    for (int32_t d = 1; d < inputs.num_rows && status.ok(); ++d) {
      auto it = entry->find(d);
      if (it == entry->end()) {
        status = absl::FailedPreconditionError(absl::StrCat(
            field, ": the draft pool holds no draft ", d, " of request '", inputs.request_id,
            "' (num_rows = ", inputs.num_rows, " verifies drafts 1..", inputs.num_rows - 1, ")"));
      } else if (it->second.token_ids.empty() && it->second.DenseValues() != step.vocab_size) {
        status = absl::FailedPreconditionError(absl::StrCat(
            field, ": pooled draft ", d, " has ", it->second.DenseValues(),
            " logprobs but this step's vocab_size is ", step.vocab_size));
      } else if (it->second.device == nullptr) {
        // SPEC 6's rule, as for sent rows. A device row was written by the CUDA kernels, which
        // write finite processed logprobs and -inf only.
        status = CheckDraftRow(it->second.logprobs.data(),
                               static_cast<int32_t>(it->second.logprobs.size()), d - 1,
                               absl::StrCat(field, ": pooled draft ", d));
      }
    }
    if (status.ok()) {
      (*entries)[i] = std::move(*entry);
    } else {
      result.results[i].status = status;
    }
  }
}

std::vector<RowTask> RowTasks(const StepPlan& plan, const StepResult& result) {
  std::vector<RowTask> tasks;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    if (!result.results[i].status.ok()) continue;
    for (size_t j = 0; j < plan.requests[i].sampled_rows.size(); ++j) {
      tasks.push_back(RowTask{static_cast<int32_t>(i), static_cast<int32_t>(j)});
    }
  }
  return tasks;
}

void AssembleStepResult(const StepPlan& plan, const std::vector<RowTask>& tasks,
                        std::vector<RowOutcome>& outcomes,
                        std::vector<std::vector<float>>& prompt_logprobs, DraftPool& pool,
                        StepResult& result) {
  const Step& step = *plan.step;
  // Where each request's rows start in `outcomes` (tasks are grouped by request, in order).
  std::vector<int64_t> first_task(plan.requests.size(), -1);
  for (size_t t = tasks.size(); t-- > 0;) first_task[tasks[t].request] = static_cast<int64_t>(t);
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    RequestResult& out = result.results[i];
    if (!out.status.ok() || first_task[i] < 0) continue;
    const RequestPlan& request = plan.requests[i];
    const size_t rows = request.sampled_rows.size();
    const size_t first = static_cast<size_t>(first_task[i]);
    for (size_t j = 0; j < rows; ++j) {
      if (!outcomes[first + j].status.ok()) {
        out.status = outcomes[first + j].status;
        break;
      }
    }
    if (!out.status.ok()) continue;
    auto emit = [&](const RowOutcome& row) {
      out.token_ids.push_back(row.token);
      out.logprobs.push_back(row.logprob);
      if (request.params.top_logprobs > 0) out.top_logprobs.push_back(row.top);
      if (step.compute_sum_smaller_probs) out.sum_smaller_probs.push_back(row.sum_smaller);
    };
    if (step.kind == StepKind::kDecode) {
      // Accepted drafts up to the first rejection, then one more token; nothing after it.
      for (size_t j = 0; j < rows; ++j) {
        const RowOutcome& row = outcomes[first + j];
        emit(row);
        if (j + 1 == rows || !row.accepted) break;
        ++out.num_accepted;
      }
    } else {
      for (size_t j = 0; j < rows; ++j) emit(outcomes[first + j]);
    }
    if (i < prompt_logprobs.size()) out.prompt_logprobs = std::move(prompt_logprobs[i]);
    if (step.kind == StepKind::kDraft) {
      std::vector<std::pair<int32_t, DraftRow>> rows_to_store;
      for (size_t j = 0; j < rows; ++j) {
        rows_to_store.emplace_back(step.requests[i].draft_indices[j],
                                   std::move(outcomes[first + j].draft_row));
      }
      const absl::Status stored =
          pool.Store(DraftPoolKey(step.pool_scope, out.request_id), std::move(rows_to_store));
      if (!stored.ok()) {
        out.status = absl::Status(stored.code(), absl::StrCat(RequestField(i), ": ", stored.message()));
      }
    }
    if (!out.status.ok()) {
      out.token_ids.clear();
      out.logprobs.clear();
      out.top_logprobs.clear();
      out.sum_smaller_probs.clear();
      out.prompt_logprobs.clear();
      out.num_accepted = 0;
    }
  }
}

}  // namespace samplerd
