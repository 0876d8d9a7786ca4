#include "cuda/job_launch.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"
#include "sampler/status_macros.h"

namespace samplerd {
namespace cuda {
namespace {

std::string DimText(const dim3& d) { return absl::StrCat(d.x, "x", d.y, "x", d.z); }

// What a failed launch was: every launch of the step's path with its grid, block and dynamic
// shared memory, the lane, and the step's shapes (issue 25 asks for it in the log; the service
// logs the step's error).
std::string DescribeLaunch(const StepParams& params, bool fused_fits, const Lane& lane,
                           const Step& step, int masks, int q_rows) {
  std::vector<LaunchConfig> configs;
  if (fused_fits) {
    configs = {SplitRowsConfig(params), FusedRowsConfig(params), RawRowsConfig(params)};
  } else {
    configs = {PrepareRowsConfig(params), RowUpdatesConfig(params), SampleRowsConfig(params)};
  }
  std::string out = absl::StrCat("launch on lane ", lane.index, ":");
  for (const LaunchConfig& c : configs) {
    absl::StrAppend(&out, " ", c.kernel, " grid ", DimText(c.grid), " block ", DimText(c.block),
                    " smem ", c.dynamic_smem, " B;");
  }
  absl::StrAppend(&out, " step ", StepKindName(step.kind), " vocab_size ", params.vocab_size,
                  " logits [", step.logits.rows, ", ", step.logits.cols, "] row_stride ",
                  params.row_stride, " ", DTypeName(step.logits.dtype),
                  step.logits.on_device ? " (device)" : " (host)",
                  step.logits.shards.empty() ? "" : absl::StrCat(" in ", params.num_shards, " shards"),
                  ", jobs ", params.num_jobs,
                  " (split ", params.num_split, ", fused ", params.num_fused, ", raw ", params.num_raw,
                  "), updates ",
                  params.num_updates, ", masks ", masks, ", host q rows ", q_rows,
                  ", force_top_n ", step.force_top_n);
  return out;
}

}  // namespace

std::optional<DeviceOutput> PlanDeviceOutput(const StepPlan& plan, const StepJobs& jobs,
                                             const StepResult& result, size_t max_jobs_per_launch) {
  const Step& step = *plan.step;
  if (!step.output.any() || step.kind == StepKind::kDraft || jobs.jobs.empty() ||
      jobs.jobs.size() > max_jobs_per_launch) {
    return std::nullopt;
  }
  DeviceOutput out;
  out.target = step.output;
  out.decode = step.kind == StepKind::kDecode;
  out.requests.resize(result.results.size());
  for (size_t i = 0; i < result.results.size(); ++i) {
    out.requests[i].failed = result.results[i].status.ok() ? 0 : 1;
  }
  // Jobs are grouped by request, in order: the sampled rows, then the prompt rows.
  for (size_t k = 0; k < jobs.jobs.size(); ++k) {
    OutputRequest& r = out.requests[jobs.jobs[k].request];
    const int32_t index = static_cast<int32_t>(k);
    if (k < jobs.num_sampled) {
      if (r.rows++ == 0) r.first_job = index;
    } else if (r.prompt_count++ == 0) {
      r.prompt_first = index;
    }
  }
  return out;
}

absl::Status LaunchJobs(Lane& lane, const Step& step, const LogitsView& device_logits,
                        StepJobs& step_jobs, size_t begin, size_t end, const LaunchOptions& options,
                        std::vector<RowResult>& results, float* kernel_us) {
  std::vector<HostJob>& jobs = step_jobs.jobs;
  const int32_t V = step.vocab_size;
  const int n = static_cast<int>(end - begin);
  const size_t mask_bytes = 4 * ((static_cast<size_t>(V) + 31) / 32);
  int masks = 0, verifies = 0;  // verifies: q rows uploaded from the host
  int checks = 0;               // worker's device q rows (CheckDraftRows)
  size_t q_ids = 0;             // their top-N ids, uploaded
  std::vector<RowUpdate>& updates = lane.updates;  // every job's updates, job after job
  updates.clear();
  for (size_t i = begin; i < end; ++i) {
    HostJob& h = jobs[i];
    masks += h.mask != nullptr;
    verifies += h.q_host >= 0;
    checks += h.job.q_check;
    if (h.q_ids != nullptr) q_ids += h.job.q_n;
    h.job.update_begin = static_cast<int32_t>(updates.size());
    updates.insert(updates.end(), h.updates.begin(), h.updates.end());
    h.job.update_end = static_cast<int32_t>(updates.size());
  }

  // The input block's layout, the same in pinned staging and on the device. The sizes are
  // bounded by the step's limits (rows, V, token lists), far from overflowing size_t.
  const size_t job_bytes = n * sizeof(RowJob);
  const size_t list_bytes = 2 * n * sizeof(int32_t);  // split_jobs, fused_jobs, raw_jobs
  const size_t update_bytes = updates.size() * sizeof(RowUpdate);
  const size_t q_bytes = static_cast<size_t>(verifies) * V * sizeof(float);
  const size_t q_id_bytes = q_ids * sizeof(int32_t);
  const size_t result_bytes = n * sizeof(RowResult);
  const size_t at_lists = Align256(job_bytes);
  const size_t at_updates = at_lists + Align256(list_bytes);
  const size_t at_masks = at_updates + Align256(update_bytes);
  const size_t at_q = at_masks + Align256(masks * mask_bytes);
  const size_t at_q_ids = at_q + Align256(q_bytes);
  const size_t at_results = at_q_ids + Align256(q_id_bytes);
  const size_t at_row_max = at_results + Align256(result_bytes);
  const size_t at_output = at_row_max + Align256(n * sizeof(unsigned int));
  const DeviceOutput* output = options.output;
  const size_t output_bytes = output == nullptr ? 0 : output->requests.size() * sizeof(OutputRequest);
  const size_t at_shards = at_output + Align256(output_bytes);
  const size_t shard_bytes = device_logits.shards.size() * sizeof(DeviceShard);  // <= 16
  const size_t block_bytes = at_shards + Align256(shard_bytes);
  RETURN_IF_ERROR(lane.staging.Reserve(block_bytes));
  RETURN_IF_ERROR(lane.inputs_d.Reserve(block_bytes));
  RETURN_IF_ERROR(lane.workspace.Reserve(StepParams::WorkspaceBytes(n, V)));
  char* stage = lane.staging.as<char>();
  char* device = lane.inputs_d.as<char>();
  auto* job_stage = reinterpret_cast<RowJob*>(stage);
  auto* list_stage = reinterpret_cast<int32_t*>(stage + at_lists);
  if (update_bytes > 0) std::memcpy(stage + at_updates, updates.data(), update_bytes);
  // Results start zeroed (no status bits) and the row maxima at the smallest order key.
  std::memset(stage + at_results, 0, at_output - at_results);
  if (output_bytes > 0) std::memcpy(stage + at_output, output->requests.data(), output_bytes);
  auto* shard_stage = reinterpret_cast<DeviceShard*>(stage + at_shards);
  for (size_t s = 0; s < device_logits.shards.size(); ++s) {
    const LogitsShard& shard = device_logits.shards[s];
    shard_stage[s] = DeviceShard{static_cast<const char*>(shard.data), shard.row_stride,
                                 shard.col_begin, shard.col_begin + shard.cols};
  }
  int m = 0, qv = 0;
  size_t qi = 0;
  for (int k = 0; k < n; ++k) {
    HostJob& h = jobs[begin + k];
    RowJob job = h.job;
    job.mask = nullptr;
    job.pool_out = nullptr;
    if (h.mask != nullptr) {
      std::memcpy(stage + at_masks + m * mask_bytes, h.mask, mask_bytes);
      job.mask = reinterpret_cast<const unsigned char*>(device + at_masks + m * mask_bytes);
      ++m;
    }
    if (h.q_host >= 0) {
      const size_t at = at_q + static_cast<size_t>(qv) * V * sizeof(float);
      std::memcpy(stage + at, step_jobs.q_rows[h.q_host].data(), V * sizeof(float));
      job.q_values = device + at;
      ++qv;
    }
    if (h.q_ids != nullptr) {
      const size_t at = at_q_ids + qi * sizeof(int32_t);
      std::memcpy(stage + at, h.q_ids, job.q_n * sizeof(int32_t));
      job.q_ids = reinterpret_cast<const int32_t*>(device + at);
      qi += job.q_n;
    }
    // A DRAFT row whose device range could not be had (its request has failed) writes nothing.
    if (h.pool_row != nullptr) job.pool_out = const_cast<float*>(h.pool_row->data);
    job_stage[k] = job;
  }
  // Each job's path from its own parameters (never from the batch): split, else fused.
  const bool fused_fits = FusedPathFits(V);
  const bool split_on = fused_fits && options.split_path;
  int num_split = 0;
  for (int k = 0; k < n; ++k) {
    if (split_on && SplitPathEligible(job_stage[k], V)) list_stage[num_split++] = k;
  }
  int num_fused = num_split;
  for (int k = 0; k < n; ++k) {
    if (!(split_on && SplitPathEligible(job_stage[k], V))) list_stage[num_fused++] = k;
  }
  num_fused -= num_split;
  // RAW logprobs (SPEC 7): reported by LaunchRawRows after either path.
  int num_raw = 0;
  for (int k = 0; k < n && fused_fits; ++k) {
    if (job_stage[k].raw_logprobs != 0) list_stage[n + num_raw++] = k;
  }
  RETURN_IF_ERROR(lane.split_d.Reserve(SplitScratchBytes(num_split, V)));
  if (num_split > lane.split_arrival_slots) {
    RETURN_IF_ERROR(lane.split_arrivals_d.Reserve(num_split * sizeof(unsigned int)));
    SAMPLERD_CUDA_RETURN(cudaMemsetAsync(lane.split_arrivals_d.as<void>(), 0,
                                         num_split * sizeof(unsigned int), lane.stream));
    lane.split_arrival_slots = num_split;
  }
  // Everything the launches read, in one copy.
  SAMPLERD_CUDA_RETURN(
      cudaMemcpyAsync(device, stage, block_bytes, cudaMemcpyHostToDevice, lane.stream));

  StepParams params;
  params.logits = device_logits.data;
  params.dtype = device_logits.dtype;
  params.row_stride = device_logits.row_stride;
  params.vocab_size = V;
  if (!device_logits.shards.empty()) {
    params.shards = reinterpret_cast<const DeviceShard*>(device + at_shards);
    params.num_shards = static_cast<int32_t>(device_logits.shards.size());
  }
  params.jobs = reinterpret_cast<const RowJob*>(device);
  params.num_jobs = n;
  params.updates = reinterpret_cast<const RowUpdate*>(device + at_updates);
  params.num_updates = static_cast<int32_t>(updates.size());
  params.workspace = lane.workspace.as<float>();
  params.row_max = reinterpret_cast<unsigned int*>(device + at_row_max);
  params.results = reinterpret_cast<RowResult*>(device + at_results);
  if (fused_fits) {
    const auto* lists = reinterpret_cast<const int32_t*>(device + at_lists);
    params.split_jobs = lists;
    params.num_split = num_split;
    params.split_scratch = lane.split_d.as<void>();
    params.split_arrivals = lane.split_arrivals_d.as<unsigned int>();
    params.split_stream = num_split >= options.split_stream_rows ? 1 : 0;
    params.fused_jobs = lists + num_split;
    params.num_fused = num_fused;
    if (num_raw > 0) {
      params.raw_jobs = lists + n;
      params.num_raw = num_raw;
    }
  }
  if (const char* invalid = params.Validate(); invalid != nullptr) {
    return absl::InternalError(absl::StrCat("cuda step params: ", invalid));
  }
  if (options.probe != nullptr) RETURN_IF_ERROR(options.probe->BeforeLaunch(lane.stream));
  SAMPLERD_CUDA_RETURN(cudaEventRecord(lane.start, lane.stream));
  absl::Status launched = [&]() -> absl::Status {
    if (options.probe != nullptr) RETURN_IF_ERROR(options.probe->AtLaunch(lane.stream));
    if (checks > 0) SAMPLERD_CUDA_RETURN(LaunchCheckDraftRows(params, lane.stream));
    if (fused_fits) {
      // Rows with a small top-k: independent blocks over chunks of each row, the last of which
      // finishes the row. The rest: one read of each row by a cluster of blocks, which also runs
      // the general algorithm for the rows its candidates cannot finish.
      SAMPLERD_CUDA_RETURN(LaunchSplitRows(params, lane.stream));
      SAMPLERD_CUDA_RETURN(LaunchFusedRows(params, lane.stream));
      SAMPLERD_CUDA_RETURN(LaunchRawRows(params, lane.stream));
    } else {
      SAMPLERD_CUDA_RETURN(LaunchPrepareRows(params, lane.stream));
      SAMPLERD_CUDA_RETURN(LaunchRowUpdates(params, lane.stream));
      SAMPLERD_CUDA_RETURN(LaunchSampleRows(params, lane.stream));
    }
    return absl::OkStatus();
  }();
  if (!launched.ok()) {
    return absl::Status(launched.code(),
                        absl::StrCat(launched.message(), "; ",
                                     DescribeLaunch(params, fused_fits, lane, step, masks, verifies)));
  }
  SAMPLERD_CUDA_RETURN(cudaEventRecord(lane.stop, lane.stream));
  if (output != nullptr) {
    // Before the results go back to the host: the worker's next forward waits for these
    // writes only. The lane's stream is waited for below, so the regions' leases outlive them.
    OutputParams op;
    op.results = params.results;
    op.requests = reinterpret_cast<const OutputRequest*>(device + at_output);
    op.num_requests = static_cast<int32_t>(output->requests.size());
    op.decode = output->decode ? 1 : 0;
    op.token_ids = static_cast<int32_t*>(output->target.token_ids);
    op.tokens_per_request = output->target.tokens_per_request;
    op.num_accepted = static_cast<int32_t*>(output->target.num_accepted);
    op.done_word = static_cast<unsigned int*>(output->target.done_word);
    op.done_value = output->target.done_value;
    SAMPLERD_CUDA_RETURN(LaunchWriteStepOutput(op, lane.stream));
    if (output->target.done_event != nullptr) {
      SAMPLERD_CUDA_RETURN(cudaEventRecord(
          static_cast<cudaEvent_t>(const_cast<void*>(output->target.done_event)), lane.stream));
    }
  }
  // The results come back into the staging block they were zeroed in: pinned, read once below.
  SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(stage + at_results, device + at_results, result_bytes,
                                       cudaMemcpyDeviceToHost, lane.stream));
  SAMPLERD_CUDA_RETURN(cudaStreamSynchronize(lane.stream));  // this stream only, never the device
  if (options.probe != nullptr) RETURN_IF_ERROR(options.probe->AfterStep(num_split > 0));
  float ms = 0.0f;
  SAMPLERD_CUDA_RETURN(cudaEventElapsedTime(&ms, lane.start, lane.stop));
  *kernel_us += ms * 1000.0f;
  const auto* r = reinterpret_cast<const RowResult*>(stage + at_results);
  results.insert(results.end(), r, r + n);
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace samplerd
