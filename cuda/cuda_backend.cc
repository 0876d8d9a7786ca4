// The CUDA backend's step: the plan's jobs (job_builder), on a free lane (lane), staged and
// launched (job_launch), their results decoded (job_results) and assembled by the
// backend-independent rules (sampler/step_assembly). This file holds the lanes, the device
// draft store and the order of those stages.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cuda/cuda_status.h"
#include "cuda/device_draft_store.h"
#include "cuda/job_builder.h"
#include "cuda/job_launch.h"
#include "cuda/job_results.h"
#include "cuda/lane.h"
#include "sampler/status_macros.h"
#include "sampler/step_assembly.h"

namespace samplerd {
namespace {

// Jobs of one launch: bounds the workspace (jobs x V floats) whatever the prompt length.
constexpr size_t kMaxJobsPerLaunch = 8192;

// Writes a step's tokens where its StepOutput asked (issue 46), on `stream`, in the order the
// proto promises: token ids, accept counts, the done word, then the done event, for the steps
// whose output the device cannot write itself (PlanDeviceOutput). The tokens are the assembled
// results, so they are copied up from here; the step waits for the copies, so the host arrays and the regions' leases
// outlive them. The host array holds only the columns some request filled: the client's
// tokens_per_request (as large as its region) costs device memsets, never host memory.
absl::Status WriteStepOutput(cudaStream_t stream, const StepOutputTarget& out,
                             const StepResult& result) {
  const size_t requests = result.results.size();
  std::vector<int32_t> tokens;
  if (out.token_ids != nullptr && requests > 0) {
    const size_t stride = static_cast<size_t>(out.tokens_per_request);
    size_t filled = 1;
    for (const RequestResult& r : result.results) {
      if (r.status.ok()) filled = std::max(filled, r.token_ids.size());
    }
    filled = std::min(filled, stride);  // planning checked the stride; min() keeps it in bounds
    tokens.assign(requests * filled, -1);
    for (size_t i = 0; i < requests; ++i) {
      const RequestResult& r = result.results[i];
      if (!r.status.ok()) continue;
      std::copy_n(r.token_ids.begin(), std::min(filled, r.token_ids.size()),
                  tokens.begin() + static_cast<std::ptrdiff_t>(i * filled));
    }
    if (filled < stride) {  // -1 (all bits set) past every request's tokens
      SAMPLERD_CUDA_RETURN(cudaMemsetAsync(out.token_ids, 0xFF,
                                           requests * stride * sizeof(int32_t), stream));
    }
    SAMPLERD_CUDA_RETURN(cudaMemcpy2DAsync(out.token_ids, stride * sizeof(int32_t), tokens.data(),
                                           filled * sizeof(int32_t), filled * sizeof(int32_t),
                                           requests, cudaMemcpyHostToDevice, stream));
  }
  std::vector<int32_t> accepted;
  if (out.num_accepted != nullptr) {
    accepted.resize(requests);
    for (size_t i = 0; i < requests; ++i) accepted[i] = result.results[i].num_accepted;
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(out.num_accepted, accepted.data(),
                                         accepted.size() * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, stream));
  }
  const uint32_t done = out.done_value;
  if (out.done_word != nullptr) {
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(out.done_word, &done, sizeof(done),
                                         cudaMemcpyHostToDevice, stream));
  }
  if (out.done_event != nullptr) {
    SAMPLERD_CUDA_RETURN(cudaEventRecord(
        static_cast<cudaEvent_t>(const_cast<void*>(out.done_event)), stream));
  }
  SAMPLERD_CUDA_RETURN(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace

bool CudaDeviceUsable(int device, std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    if (why != nullptr) *why = absl::StrCat("no usable CUDA driver: ", cudaGetErrorName(error));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (device < 0 || device >= count) {
    if (why != nullptr) *why = absl::StrCat("CUDA device ", device, " not present (", count, " found)");
    return false;
  }
  return true;
}

struct CudaBackend::Impl {
  explicit Impl(const CudaBackendOptions& options)
      : options(options),
        draft_store(std::make_shared<cuda::DeviceDraftStore>(
            options.draft_pool.capacity_bytes / static_cast<int64_t>(sizeof(float)))),
        pool(options.draft_pool) {}

  absl::Status Init() {
    SAMPLERD_CUDA_RETURN(cudaSetDevice(options.device));
    cudaDeviceProp prop;
    SAMPLERD_CUDA_RETURN(cudaGetDeviceProperties(&prop, options.device));
    int mps_enabled = 0;
    SAMPLERD_CUDA_RETURN(cudaDeviceGetAttribute(&mps_enabled, cudaDevAttrMpsEnabled,
                                                options.device));
    mps = mps_enabled != 0;
    device_name = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", device ",
                               options.device, ")", mps ? ", MPS client" : "");
    const int count = std::max(1, options.streams);
    for (int i = 0; i < count; ++i) {
      auto lane = std::make_unique<cuda::Lane>(i);
      RETURN_IF_ERROR(lane->Init());
      free_lanes.push_back(lane.get());
      lanes.push_back(std::move(lane));
    }
    return absl::OkStatus();
  }

  // Blocks until a lane is free. Callers beyond the lanes wait here (the service admits at
  // most max_concurrent_steps(), so in the server they never do).
  cuda::Lane* AcquireLane() {
    absl::MutexLock lock(&lanes_mu);
    lanes_mu.Await(absl::Condition(
        +[](std::vector<cuda::Lane*>* free) { return !free->empty(); }, &free_lanes));
    cuda::Lane* lane = free_lanes.back();
    free_lanes.pop_back();
    return lane;
  }
  void ReleaseLane(cuda::Lane* lane) {
    absl::MutexLock lock(&lanes_mu);
    free_lanes.push_back(lane);
  }

  // The device part of a step on `lane`: host logits copied over (or the producer's event
  // waited for), then the jobs in launches of at most kMaxJobsPerLaunch.
  absl::Status RunOnLane(cuda::Lane& lane, const Step& step, cuda::StepJobs& jobs,
                         const cuda::DeviceOutput* output, std::vector<cuda::RowResult>& results,
                         float* kernel_us);

  const CudaBackendOptions options;
  // Declared before the pool: the pool's rows free themselves into the store (which their
  // deleters also keep alive).
  std::shared_ptr<cuda::DeviceDraftStore> draft_store;
  DraftPool pool;
  std::string device_name;
  bool mps = false;
  // A step's failure that left the context unusable (Sample checks after each failure).
  mutable absl::Mutex broken_mu;
  absl::Status broken ABSL_GUARDED_BY(broken_mu);
  std::vector<std::unique_ptr<cuda::Lane>> lanes;
  absl::Mutex lanes_mu;
  std::vector<cuda::Lane*> free_lanes ABSL_GUARDED_BY(lanes_mu);
  // Benchmarks only (set between steps, read by the step's thread).
  absl::Mutex bench_mu;
  std::shared_ptr<cuda::LaunchProbe> probe ABSL_GUARDED_BY(bench_mu);
  bool split_path ABSL_GUARDED_BY(bench_mu) = true;
  int split_stream_rows ABSL_GUARDED_BY(bench_mu) = cuda::kSplitStreamRows;
};

absl::Status CudaBackend::Impl::RunOnLane(cuda::Lane& lane, const Step& step,
                                          cuda::StepJobs& jobs, const cuda::DeviceOutput* output,
                                          std::vector<cuda::RowResult>& results,
                                          float* kernel_us) {
  if (lane.broken) RETURN_IF_ERROR(lane.Recover());
  // A producer's event (CUDA IPC, opaque in the core's views): our stream waits for it, the
  // host does not.
  auto wait_for = [&lane](const void* event) {
    return CudaStatus(
        cudaStreamWaitEvent(lane.stream, static_cast<cudaEvent_t>(const_cast<void*>(event)), 0),
        "cudaStreamWaitEvent");
  };
  // Logits: host views are copied to the device once per step (at full PCIe speed when the
  // host memory is pinned: a registered shm region).
  LogitsView device_logits = step.logits;
  if (!step.logits.on_device && !jobs.jobs.empty()) {
    const size_t bytes = static_cast<size_t>(step.logits.ByteExtent());
    RETURN_IF_ERROR(lane.logits.Reserve(bytes));
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(lane.logits.as<void>(), step.logits.data, bytes,
                                         cudaMemcpyHostToDevice, lane.stream));
    device_logits.data = lane.logits.as<void>();
    device_logits.on_device = true;
  } else if (step.logits.on_device && step.logits.ready_event != nullptr) {
    RETURN_IF_ERROR(wait_for(step.logits.ready_event));
  }
  // Tensor-parallel shards in device memory: each rank's producer has its own event.
  for (const LogitsShard& shard : step.logits.shards) {
    if (shard.ready_event != nullptr) RETURN_IF_ERROR(wait_for(shard.ready_event));
  }
  // A worker's draft tensors in device memory (issue 47): our stream waits for each one's
  // producer too (one event may serve several requests; a second wait on it costs nothing).
  for (const RequestInputs& request : step.requests) {
    const DraftDistributions& drafts = request.drafts;
    if (drafts.form == DraftDistributions::Form::kPool || !drafts.values.on_device ||
        drafts.values.ready_event == nullptr || drafts.values.ready_event == step.logits.ready_event) {
      continue;
    }
    RETURN_IF_ERROR(wait_for(drafts.values.ready_event));
  }
  cuda::LaunchOptions launch;
  std::shared_ptr<cuda::LaunchProbe> held_probe;
  {
    absl::MutexLock lock(&bench_mu);
    held_probe = probe;
    launch.split_path = split_path;
    launch.split_stream_rows = split_stream_rows;
  }
  launch.probe = held_probe.get();
  launch.output = output;  // PlanDeviceOutput: only for a step of one launch
  for (size_t begin = 0; begin < jobs.jobs.size(); begin += kMaxJobsPerLaunch) {
    const size_t end = std::min(jobs.jobs.size(), begin + kMaxJobsPerLaunch);
    RETURN_IF_ERROR(cuda::LaunchJobs(lane, step, device_logits, jobs, begin, end, launch,
                                     results, kernel_us));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& options) {
  std::string why;
  if (!CudaDeviceUsable(options.device, &why)) return absl::UnavailableError(why);
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

BackendInfo CudaBackend::Info() const {
  return BackendInfo{"cuda", impl_->device_name, impl_->mps};
}

absl::Status CudaBackend::Broken() const {
  absl::MutexLock lock(&impl_->broken_mu);
  if (!impl_->broken.ok()) return impl_->broken;
  // Checked live too: under MPS another client's fatal fault (a worker killed while its
  // kernels ran) tears every client's context down while samplerd may have no step to notice
  // it with, and the server takes no new client until every old one has exited. A no-op call
  // returns the sticky error.
  if (cudaSetDevice(impl_->options.device) == cudaSuccess) {
    if (const cudaError_t context = cudaFree(nullptr); context != cudaSuccess) {
      impl_->broken = CudaStatus(context, "the device context");
    }
  }
  return impl_->broken;
}

absl::StatusOr<std::string> ProbeDeviceContext(int device) {
  std::string why;
  if (!CudaDeviceUsable(device, &why)) return absl::UnavailableError(why);
  SAMPLERD_CUDA_RETURN(cudaSetDevice(device));
  SAMPLERD_CUDA_RETURN(cudaFree(nullptr));  // makes the context (an MPS client's connection)
  cudaDeviceProp prop;
  SAMPLERD_CUDA_RETURN(cudaGetDeviceProperties(&prop, device));
  int mps = 0;
  SAMPLERD_CUDA_RETURN(cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, device));
  return absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", device ", device, ")",
                      mps ? ", MPS client" : ", no MPS");
}
DraftPool& CudaBackend::draft_pool() { return impl_->pool; }
int CudaBackend::max_concurrent_steps() const { return static_cast<int>(impl_->lanes.size()); }
void CudaBackend::set_launch_probe(std::shared_ptr<cuda::LaunchProbe> probe) {
  absl::MutexLock lock(&impl_->bench_mu);
  impl_->probe = std::move(probe);
}
void CudaBackend::set_split_path(bool on) {
  absl::MutexLock lock(&impl_->bench_mu);
  impl_->split_path = on;
}
void CudaBackend::set_split_stream_rows(int rows) {
  absl::MutexLock lock(&impl_->bench_mu);
  impl_->split_stream_rows = rows;
}

absl::StatusOr<StepResult> CudaBackend::Sample(const StepPlan& plan) {
  Impl& impl = *impl_;
  SAMPLERD_CUDA_RETURN(cudaSetDevice(impl.options.device));
  StepResult result = BeginStepResult(plan);
  std::vector<DraftPool::Entry> pool_entries;
  TakeDecodeDrafts(plan, impl.pool, result, &pool_entries);
  const std::vector<RowTask> tasks = RowTasks(plan, result);
  // The host work overlaps other steps' kernels; only the device part takes a lane.
  cuda::StepJobs jobs = cuda::BuildStepJobs(plan, tasks, pool_entries, *impl.draft_store, result);
  // The StepOutput (issue 46) from the device where the step allows it, else from the host.
  const std::optional<cuda::DeviceOutput> device_output =
      impl.options.device_step_output
          ? cuda::PlanDeviceOutput(plan, jobs, result, kMaxJobsPerLaunch)
          : std::nullopt;

  cuda::Lane* lane = impl.AcquireLane();
  struct LaneGuard {
    Impl& impl;
    cuda::Lane* lane;
    ~LaneGuard() { impl.ReleaseLane(lane); }
  } lane_guard{impl, lane};
  std::vector<cuda::RowResult> results;
  results.reserve(jobs.jobs.size());
  float kernel_us = 0.0f;
  const absl::Status device_status = impl.RunOnLane(*lane, *plan.step, jobs,
                                                      device_output ? &*device_output : nullptr,
                                                      results, &kernel_us);
  if (!device_status.ok()) {
    // The step fails as a whole (its error names the call and, for a launch, the launch); the
    // lane is made usable for the next step before it is released.
    // A sticky fault (an illegal address, say) or a lost MPS server fails every call after it,
    // a no-op one too: then no later step can run in this process, and Broken() says so.
    if (const cudaError_t context = cudaFree(nullptr); context != cudaSuccess) {
      absl::MutexLock lock(&impl.broken_mu);
      if (impl.broken.ok()) impl.broken = CudaStatus(context, "the device context");
    }
    const absl::Status recovered = lane->Recover();
    if (!recovered.ok()) {
      return absl::Status(device_status.code(),
                          absl::StrCat(device_status.message(), "; lane ", lane->index,
                                       " could not be rebuilt: ", recovered.message()));
    }
    return device_status;
  }
  result.kernel_us = kernel_us;
  cuda::DecodedResults decoded = cuda::DecodeJobResults(plan, jobs, results, result);
  AssembleStepResult(plan, tasks, decoded.outcomes, decoded.prompt_logprobs, impl.pool, result);
  if (plan.step->output.any() && !device_output) {
    RETURN_IF_ERROR(WriteStepOutput(lane->stream, plan.step->output, result));
  }
  return result;
}

}  // namespace samplerd
