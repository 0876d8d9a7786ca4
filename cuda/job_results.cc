#include "cuda/job_results.h"

#include "absl/strings/str_cat.h"
#include "sampler/row_processor.h"
#include "sampler/validate.h"

namespace samplerd {
namespace cuda {
namespace {

// A row's status bits, reported in SPEC 3's order of checks (as the CPU backend does).
absl::Status RowError(const HostJob& h, int32_t status, int32_t vocab_size) {
  const std::string field = RequestField(h.request);
  if (status & kRowNonFinite) return NonFiniteLogitsError(field, h.job.logits_row, vocab_size);
  if (status & kRowOverflow) return ValueOverflowError(field, h.job.logits_row);
  return NoTokenLeftError(field, h.job.logits_row);
}

}  // namespace

DecodedResults DecodeJobResults(const StepPlan& plan, const StepJobs& jobs,
                                const std::vector<RowResult>& results, StepResult& result) {
  const int32_t V = plan.step->vocab_size;
  DecodedResults out;
  out.outcomes.resize(jobs.num_sampled);
  for (size_t k = 0; k < jobs.num_sampled; ++k) {
    const HostJob& h = jobs.jobs[k];
    const RowResult& r = results[k];
    RowOutcome& o = out.outcomes[k];
    if (r.draft_fault != 0) {
      // SPEC 6 on a worker's device draft row: an error of its request, whatever the other
      // rows hold (the CPU checks every draft row before sampling), the first row's fault.
      if (result.results[h.request].status.ok()) {
        const uint64_t fault = ~static_cast<uint64_t>(r.draft_fault);
        result.results[h.request].status = BadDraftRowError(
            absl::StrCat(RequestField(h.request),
                         h.job.q_n > 0 ? ".draft_topn.values" : ".draft_logprobs"),
            h.index, static_cast<int64_t>(fault >> 1), (fault & 1) != 0);
      }
      o.status = result.results[h.request].status;
      continue;
    }
    if (r.status != 0) {
      o.status = RowError(h, r.status, V);
      continue;
    }
    o.accepted = r.accepted != 0;
    o.token = r.token;
    o.logprob = r.logprob;
    o.sum_smaller = r.sum_smaller;
    if (h.job.top_logprobs > 0) {
      o.top.token_ids.assign(r.top_ids, r.top_ids + h.job.top_logprobs);
      o.top.logprobs.assign(r.top_logprobs, r.top_logprobs + h.job.top_logprobs);
    }
    if (h.draft_out) o.draft_row.device = h.pool_row;
  }
  out.prompt_logprobs.resize(plan.requests.size());
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    out.prompt_logprobs[i].resize(plan.step->requests[i].prompt_targets.size());
  }
  for (size_t k = jobs.num_sampled; k < jobs.jobs.size(); ++k) {
    const HostJob& h = jobs.jobs[k];
    const RowResult& r = results[k];
    if (r.status != 0) {
      if (result.results[h.request].status.ok()) {
        result.results[h.request].status = RowError(h, r.status, V);
      }
      continue;
    }
    out.prompt_logprobs[h.request][h.index] = r.prompt_logprob;
  }
  return out;
}

}  // namespace cuda
}  // namespace samplerd
