#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cuda/sampling_launch.h"
#include "sampler/dtype.h"
#include "sampler/token_updates.h"
#include "sampler/range_allocator.h"
#include "sampler/row_processor.h"
#include "sampler/status_macros.h"
#include "cuda/cuda_status.h"
#include "cuda/stage_probe.h"
#include "sampler/step_assembly.h"

namespace samplerd {
namespace {

// A grow-only allocation of device (cudaMalloc) or pinned host (cudaMallocHost) memory.
template <cudaError_t (*kAlloc)(void**, size_t), cudaError_t (*kFree)(void*)>
class GrowBuffer {
 public:
  GrowBuffer() = default;
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  ~GrowBuffer() {
    if (ptr_ != nullptr) kFree(ptr_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_ != nullptr) kFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    SAMPLERD_CUDA_RETURN(kAlloc(&ptr_, std::max<size_t>(bytes, 256)));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

cudaError_t DeviceAlloc(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
cudaError_t PinnedAlloc(void** ptr, size_t bytes) { return cudaMallocHost(ptr, bytes); }
using DeviceBuffer = GrowBuffer<DeviceAlloc, cudaFree>;
using PinnedBuffer = GrowBuffer<PinnedAlloc, cudaFreeHost>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kStageEntries = 18;  // cuda::StageProbe::stage_times: fused [0, 9), split [9, 18)
// Jobs of one launch: bounds the workspace (jobs x V floats) whatever the prompt length.
constexpr int kMaxJobsPerLaunch = 8192;

cuda::LogitsDType DTypeCode(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return cuda::kBF16;
    case DType::kFloat16:
      return cuda::kF16;
    case DType::kFloat32:
      return cuda::kF32;
  }
  return cuda::kF32;
}

// A job as the host prepares it, before device pointers are known.
struct HostJob {
  cuda::RowJob job;
  int32_t request;
  int32_t index;              // sampled row index, or prompt target index
  bool prompt;
  const unsigned char* mask;  // host bytes, or null
  bool verify;
  int32_t q_host = -1;            // verify: index of the host q row to upload, or
  const float* q_device = nullptr;  // the pooled q row already on the device
  bool draft_out;
  std::shared_ptr<const DeviceDraftRow> pool_row;  // DRAFT: where the kernel writes the row
  std::vector<cuda::RowUpdate> updates;  // SPEC 3 steps 2b-d and 3, sorted by token
};

// The draft pool's device memory: one slab of the pool's capacity, allocated at the first
// DRAFT step, carved into rows by a RangeAllocator. A DRAFT step's kernel writes each row's
// processed logprobs straight into its range and the DECODE step that verifies it reads them
// there: no copy either way. A row's range is freed by its shared_ptr's deleter, in whichever
// thread drops the last reference (the DECODE step, Release, a row replaced in the pool);
// kernels never read a freed range, since steps run one at a time and end with their stream.
class DeviceDraftStore : public std::enable_shared_from_this<DeviceDraftStore> {
 public:
  // 32 floats: every row starts 128-byte aligned.
  explicit DeviceDraftStore(int64_t capacity_floats) : ranges_(capacity_floats, 32) {}
  ~DeviceDraftStore() {
    if (slab_ != nullptr) cudaFree(slab_);
  }

  // RESOURCE_EXHAUSTED when no free range holds `values` floats.
  absl::StatusOr<std::shared_ptr<const DeviceDraftRow>> Allocate(int64_t values) {
    absl::MutexLock lock(&mu_);
    if (slab_ == nullptr && ranges_.capacity() > 0) {
      SAMPLERD_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&slab_),
                                      static_cast<size_t>(ranges_.capacity()) * sizeof(float)));
    }
    const std::optional<int64_t> at = ranges_.Allocate(values);
    if (!at.has_value()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "draft pool full: a draft row needs ", ranges_.Reserved(values),
          " elements of device memory, the largest free range has ", ranges_.largest_free(),
          " (", ranges_.capacity() - ranges_.used(), " of ", ranges_.capacity(), " free)"));
    }
    auto* row = new DeviceDraftRow{slab_ + *at, values, ranges_.Reserved(values)};
    std::shared_ptr<DeviceDraftStore> self = shared_from_this();
    return std::shared_ptr<const DeviceDraftRow>(row, [self, offset = *at](const DeviceDraftRow* r) {
      {
        absl::MutexLock lock(&self->mu_);
        self->ranges_.Free(offset);
      }
      delete r;
    });
  }

 private:
  absl::Mutex mu_;
  RangeAllocator ranges_ ABSL_GUARDED_BY(mu_);
  float* slab_ ABSL_GUARDED_BY(mu_) = nullptr;
};

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
        draft_store(std::make_shared<DeviceDraftStore>(options.draft_pool.capacity_bytes /
                                                      static_cast<int64_t>(sizeof(float)))),
        pool(options.draft_pool) {}
  ~Impl() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  absl::Status Init() {
    SAMPLERD_CUDA_RETURN(cudaSetDevice(options.device));
    SAMPLERD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    SAMPLERD_CUDA_RETURN(cudaEventCreate(&start));
    SAMPLERD_CUDA_RETURN(cudaEventCreate(&stop));
    cudaDeviceProp prop;
    SAMPLERD_CUDA_RETURN(cudaGetDeviceProperties(&prop, options.device));
    device_name = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", device ",
                               options.device, ")");
    return absl::OkStatus();
  }

  absl::Status RunJobs(const Step& step, const LogitsView& device_logits,
                       std::vector<HostJob>& jobs, size_t begin, size_t end,
                       std::vector<cuda::RowResult>& results,
                       const std::vector<std::vector<float>>& q_rows_host);

  const CudaBackendOptions options;
  // Declared before the pool: the pool's rows free themselves into the store (which their
  // deleters also keep alive).
  std::shared_ptr<DeviceDraftStore> draft_store;
  DraftPool pool;
  std::string device_name;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  absl::Mutex mu;  // one step at a time: buffers below are per step
  DeviceBuffer logits, jobs_d, lists_d, updates_d, masks_d, q_d, workspace, split_d, results_d;
  // The split path's per-row arrival counters: zeroed when allocated, and every launch leaves
  // them zero (cuda::StepParams::split_arrivals), so no per-step memset.
  DeviceBuffer split_arrivals_d;
  int split_arrival_slots = 0;
  PinnedBuffer staging, results_h;
  float kernel_us = 0.0f;
  bool stage_timing = false;
  int debug_flags = 0;
  DeviceBuffer stage_d;
  std::vector<double> stage_us;
};

absl::Status CudaBackend::Impl::RunJobs(const Step& step, const LogitsView& device_logits,
                                        std::vector<HostJob>& jobs, size_t begin, size_t end,
                                        std::vector<cuda::RowResult>& results,
                                        const std::vector<std::vector<float>>& q_rows_host) {
  const int32_t V = step.vocab_size;
  const int n = static_cast<int>(end - begin);
  const size_t mask_bytes = 4 * ((static_cast<size_t>(V) + 31) / 32);
  int masks = 0, verifies = 0;  // verifies: q rows uploaded from the host
  std::vector<cuda::RowUpdate> updates;  // every job's token updates, job after job
  for (size_t i = begin; i < end; ++i) {
    HostJob& h = jobs[i];
    masks += h.mask != nullptr;
    verifies += h.q_host >= 0;
    h.job.update_begin = static_cast<int32_t>(updates.size());
    updates.insert(updates.end(), h.updates.begin(), h.updates.end());
    h.job.update_end = static_cast<int32_t>(updates.size());
  }
  RETURN_IF_ERROR(jobs_d.Reserve(n * sizeof(cuda::RowJob)));
  RETURN_IF_ERROR(updates_d.Reserve(updates.size() * sizeof(cuda::RowUpdate)));
  RETURN_IF_ERROR(masks_d.Reserve(masks * mask_bytes));
  RETURN_IF_ERROR(q_d.Reserve(static_cast<size_t>(verifies) * V * sizeof(float)));
  RETURN_IF_ERROR(workspace.Reserve(cuda::StepParams::WorkspaceBytes(n, V)));
  RETURN_IF_ERROR(results_d.Reserve(n * sizeof(cuda::RowResult)));
  RETURN_IF_ERROR(results_h.Reserve(n * sizeof(cuda::RowResult)));

  // Stage jobs, token updates, masks and draft rows in pinned memory, then one copy each.
  const size_t job_bytes = n * sizeof(cuda::RowJob);
  const size_t pen_bytes = updates.size() * sizeof(cuda::RowUpdate);
  const size_t q_bytes = static_cast<size_t>(verifies) * V * sizeof(float);
  const size_t list_bytes = n * sizeof(int32_t);  // split_jobs, then fused_jobs
  const size_t staging_bytes = job_bytes + pen_bytes + masks * mask_bytes + q_bytes + list_bytes + 64;
  RETURN_IF_ERROR(staging.Reserve(staging_bytes));
  char* stage = staging.as<char>();
  cuda::RowJob* job_stage = reinterpret_cast<cuda::RowJob*>(stage);
  cuda::RowUpdate* pen_stage = reinterpret_cast<cuda::RowUpdate*>(stage + job_bytes);
  unsigned char* mask_stage = reinterpret_cast<unsigned char*>(stage + job_bytes + pen_bytes);
  float* q_stage = reinterpret_cast<float*>(stage + job_bytes + pen_bytes + masks * mask_bytes);
  int32_t* list_stage = reinterpret_cast<int32_t*>(reinterpret_cast<char*>(q_stage) + q_bytes);
  std::memcpy(pen_stage, updates.data(), pen_bytes);
  int m = 0, qv = 0;
  for (int k = 0; k < n; ++k) {
    HostJob& h = jobs[begin + k];
    cuda::RowJob job = h.job;
    job.mask = nullptr;
    job.q_dense = nullptr;
    job.pool_out = nullptr;
    if (h.mask != nullptr) {
      std::memcpy(mask_stage + m * mask_bytes, h.mask, mask_bytes);
      job.mask = masks_d.as<unsigned char>() + m * mask_bytes;
      ++m;
    }
    if (h.q_device != nullptr) {
      job.q_dense = h.q_device;
    } else if (h.q_host >= 0) {
      std::memcpy(q_stage + static_cast<size_t>(qv) * V, q_rows_host[h.q_host].data(), V * sizeof(float));
      job.q_dense = q_d.as<float>() + static_cast<size_t>(qv) * V;
      ++qv;
    }
    // A DRAFT row whose device range could not be had (its request has failed) writes nothing.
    if (h.pool_row != nullptr) job.pool_out = const_cast<float*>(h.pool_row->data);
    job_stage[k] = job;
  }
  // Each job's path from its own parameters (never from the batch): split, else fused.
  const bool fused_fits = cuda::FusedPathFits(V);
  const bool split_on = fused_fits && (debug_flags & CudaBackend::kDebugNoSplitPath) == 0;
  int num_split = 0;
  for (int k = 0; k < n; ++k) {
    if (split_on && cuda::SplitPathEligible(job_stage[k], V)) list_stage[num_split++] = k;
  }
  int num_fused = num_split;
  for (int k = 0; k < n; ++k) {
    if (!(split_on && cuda::SplitPathEligible(job_stage[k], V))) list_stage[num_fused++] = k;
  }
  num_fused -= num_split;
  RETURN_IF_ERROR(lists_d.Reserve(list_bytes));
  RETURN_IF_ERROR(split_d.Reserve(cuda::SplitScratchBytes(num_split, V)));
  if (num_split > split_arrival_slots) {
    RETURN_IF_ERROR(split_arrivals_d.Reserve(num_split * sizeof(unsigned int)));
    SAMPLERD_CUDA_RETURN(cudaMemsetAsync(split_arrivals_d.as<void>(), 0, num_split * sizeof(unsigned int), stream));
    split_arrival_slots = num_split;
  }
  SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(lists_d.as<void>(), list_stage, list_bytes, cudaMemcpyHostToDevice, stream));
  SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(jobs_d.as<void>(), job_stage, job_bytes, cudaMemcpyHostToDevice, stream));
  if (pen_bytes > 0) {
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(updates_d.as<void>(), pen_stage, pen_bytes, cudaMemcpyHostToDevice, stream));
  }
  if (masks > 0) {
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(masks_d.as<void>(), mask_stage, masks * mask_bytes, cudaMemcpyHostToDevice, stream));
  }
  if (q_bytes > 0) {
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(q_d.as<void>(), q_stage, q_bytes, cudaMemcpyHostToDevice, stream));
  }
  SAMPLERD_CUDA_RETURN(cudaMemsetAsync(results_d.as<void>(), 0, n * sizeof(cuda::RowResult), stream));
  float* ws = workspace.as<float>();
  unsigned int* row_max = reinterpret_cast<unsigned int*>(ws + static_cast<size_t>(n) * V);
  SAMPLERD_CUDA_RETURN(cudaMemsetAsync(row_max, 0, n * sizeof(unsigned int), stream));

  cuda::StepParams params;
  params.logits = device_logits.data;
  params.dtype = DTypeCode(device_logits.dtype);
  params.row_stride = device_logits.row_stride;
  params.vocab_size = V;
  params.jobs = jobs_d.as<cuda::RowJob>();
  params.num_jobs = n;
  params.updates = updates_d.as<cuda::RowUpdate>();
  params.num_updates = static_cast<int32_t>(updates.size());
  params.workspace = ws;
  params.row_max = row_max;
  params.results = results_d.as<cuda::RowResult>();
  if (fused_fits) {
    params.split_jobs = lists_d.as<int32_t>();
    params.num_split = num_split;
    params.split_scratch = split_d.as<void>();
    params.split_arrivals = split_arrivals_d.as<unsigned int>();
    params.fused_jobs = lists_d.as<int32_t>() + num_split;
    params.num_fused = num_fused;
  }
  if (stage_timing) {
    // Benchmarks only: the instrumented kernels (//cuda:cuda_backend_probed) stamp their stages.
    RETURN_IF_ERROR(stage_d.Reserve(kStageEntries * sizeof(unsigned long long)));
    SAMPLERD_CUDA_RETURN(cudaMemsetAsync(stage_d.as<void>(), 0, kStageEntries * sizeof(unsigned long long), stream));
    cuda::StageProbe probe;
    probe.stage_times = stage_d.as<unsigned long long>();
    probe.flags = debug_flags & 0xff;
    SAMPLERD_CUDA_RETURN(cuda::SetStageProbe(probe));
  }
  if (const char* invalid = params.Validate(); invalid != nullptr) {
    return absl::InternalError(absl::StrCat("cuda step params: ", invalid));
  }
  SAMPLERD_CUDA_RETURN(cudaEventRecord(start, stream));
  if (fused_fits) {
    // Rows with a small top-k: independent blocks over chunks of each row, the last of which
    // finishes the row. The rest: one read of each row by a cluster of blocks, which also runs the
    // general algorithm for the rows its candidates cannot finish.
    SAMPLERD_CUDA_RETURN(cuda::LaunchSplitRows(params, stream));
    SAMPLERD_CUDA_RETURN(cuda::LaunchFusedRows(params, stream));
  } else {
    SAMPLERD_CUDA_RETURN(cuda::LaunchPrepareRows(params, stream));
    SAMPLERD_CUDA_RETURN(cuda::LaunchRowUpdates(params, stream));
    SAMPLERD_CUDA_RETURN(cuda::LaunchSampleRows(params, stream));
  }
  SAMPLERD_CUDA_RETURN(cudaEventRecord(stop, stream));
  SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(results_h.as<void>(), results_d.as<void>(),
                                       n * sizeof(cuda::RowResult), cudaMemcpyDeviceToHost, stream));
  SAMPLERD_CUDA_RETURN(cudaStreamSynchronize(stream));  // this stream only, never the device
  if (stage_timing) {
    unsigned long long t[kStageEntries];
    SAMPLERD_CUDA_RETURN(cudaMemcpy(t, stage_d.as<void>(), sizeof(t), cudaMemcpyDeviceToHost));
    stage_us.clear();
    // The split path's stages when it ran (from its chunk kernel's start), else the fused one's.
    const int t0 = num_split > 0 ? 9 : 0;
    const std::vector<int> order = num_split > 0 ? std::vector<int>{10, 11, 12, 13, 14, 15, 16, 17}
                                                 : std::vector<int>{1, 2, 7, 3, 4, 5, 6};
    for (int k : order) stage_us.push_back(t[k] >= t[t0] ? (t[k] - t[t0]) * 1e-3 : -1.0);
  }
  float ms = 0.0f;
  SAMPLERD_CUDA_RETURN(cudaEventElapsedTime(&ms, start, stop));
  kernel_us += ms * 1000.0f;
  const cuda::RowResult* r = results_h.as<cuda::RowResult>();
  results.insert(results.end(), r, r + n);
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

BackendInfo CudaBackend::Info() const { return BackendInfo{"cuda", impl_->device_name}; }
DraftPool& CudaBackend::draft_pool() { return impl_->pool; }
float CudaBackend::last_kernel_us() const { return impl_->kernel_us; }
void CudaBackend::set_stage_timing(bool on, int debug_flags) {
  impl_->stage_timing = on;
  impl_->debug_flags = debug_flags;
  // Off: the probe points nowhere again (the production kernels have none: an error, ignored).
  if (!on) cuda::SetStageProbe(cuda::StageProbe{});
}
std::vector<double> CudaBackend::last_stage_us() const { return impl_->stage_us; }

namespace {

// The device form of a row's token updates (sampler/token_updates.h), with the request's
// penalty settings in each entry.
std::vector<cuda::RowUpdate> DeviceUpdates(const std::vector<TokenUpdate>& updates,
                                           const NormalizedParams& params) {
  std::vector<cuda::RowUpdate> out;
  out.reserve(updates.size());
  for (const TokenUpdate& u : updates) {
    const int32_t flags = (u.ban ? cuda::kUpdateBan : 0) | (u.has_bias ? cuda::kUpdateBias : 0) |
                          (u.penalize ? cuda::kUpdatePenalize : 0);
    out.push_back(cuda::RowUpdate{u.token, flags, u.bias, u.count, params.repetition_penalty,
                                  params.presence_penalty, params.frequency_penalty});
  }
  return out;
}

}  // namespace

absl::StatusOr<StepResult> CudaBackend::Sample(const StepPlan& plan) {
  Impl& impl = *impl_;
  absl::MutexLock lock(&impl.mu);
  SAMPLERD_CUDA_RETURN(cudaSetDevice(impl.options.device));
  impl.kernel_us = 0.0f;
  const Step& step = *plan.step;
  const int32_t V = step.vocab_size;
  StepResult result = BeginStepResult(plan);
  std::vector<DraftPool::Entry> pool_entries;
  TakeDecodeDrafts(plan, impl.pool, result, &pool_entries);
  const std::vector<RowTask> tasks = RowTasks(plan, result);

  // Host jobs: the sampled rows, then the prompt rows.
  std::vector<HostJob> jobs;
  std::vector<std::vector<float>> q_rows;  // dense q of the verify jobs whose q is on the host
  for (const RowTask& task : tasks) {
    const RequestPlan& request = plan.requests[task.request];
    const RequestInputs& inputs = *request.inputs;
    const SampledRow& row = request.sampled_rows[task.index];
    HostJob h{};
    cuda::RowJob& j = h.job;
    j.logits_row = row.row;
    j.temperature = request.params.temperature;
    j.top_p = request.params.top_p;
    j.top_k = request.params.top_k;
    j.min_p = request.params.min_p;
    j.top_logprobs = std::min(request.params.top_logprobs, cuda::kMaxTopLogprobs);
    j.force_top_n = step.force_top_n;
    j.golden = row.golden;
    j.draft_token = -1;
    j.target = -1;
    j.want_sum_smaller = step.compute_sum_smaller_probs ? 1 : 0;
    j.seed = request.seed;
    j.position = row.position;
    h.request = task.request;
    h.index = task.index;
    h.mask = row.mask;
    const bool verify = step.kind == StepKind::kDecode && task.index < inputs.num_rows - 1;
    j.kind = verify ? cuda::kRowVerify : cuda::kRowFresh;
    h.updates = DeviceUpdates(request.RowUpdates(step.kind, task.index), request.params);
    if (verify) {
      h.verify = true;
      j.draft_token = inputs.draft_token_ids[task.index];
      const DraftDistributions& d = inputs.drafts;
      const DraftRow* pooled = d.form == DraftDistributions::Form::kPool
                                   ? &pool_entries[task.request].at(task.index + 1)
                                   : nullptr;
      if (pooled != nullptr && pooled->device != nullptr) {
        // This backend's own DRAFT output, still on the device: read in place. The kernel
        // wrote -inf or finite processed logprobs, so there is nothing to check.
        h.q_device = pooled->device->data;
      } else {
        std::vector<float> q(V, kNegInf);
        if (d.form == DraftDistributions::Form::kDense) {
          LoadRowAsFloat(d.values, task.index, V, q.data());
        } else if (d.form == DraftDistributions::Form::kTopN) {
          const int32_t n = d.values.cols;
          std::vector<float> values(n);
          LoadRowAsFloat(d.values, task.index, n, values.data());
          for (int32_t i = 0; i < n; ++i) {
            const int32_t t = d.token_ids[static_cast<size_t>(task.index) * n + i];
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
        // Draft logprobs of NaN or +inf are the request's error, as on the CPU backend; they
        // are checked where verification could read them.
        bool bad = false;
        for (float v : q) bad |= std::isnan(v) || v == std::numeric_limits<float>::infinity();
        if (bad) {
          result.results[task.request].status = absl::InvalidArgumentError(absl::StrCat(
              RequestField(task.request), ": a draft logprob at verify row ", task.index,
              " is NaN or +inf"));
        }
        h.q_host = static_cast<int32_t>(q_rows.size());
        q_rows.push_back(std::move(q));
      }
    }
    h.draft_out = step.kind == StepKind::kDraft;
    if (h.draft_out && result.results[task.request].status.ok()) {
      auto row = impl.draft_store->Allocate(V);
      if (row.ok()) {
        h.pool_row = *std::move(row);
      } else {
        result.results[task.request].status = absl::Status(
            row.status().code(), absl::StrCat(RequestField(task.request), ": ", row.status().message()));
      }
    }
    jobs.push_back(std::move(h));
  }
  const size_t num_sample_jobs = jobs.size();
  if (step.kind == StepKind::kPrefill) {
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      if (!result.results[i].status.ok()) continue;
      const RequestPlan& request = plan.requests[i];
      const RequestInputs& inputs = *request.inputs;
      for (size_t k = 0; k < inputs.prompt_targets.size(); ++k) {
        HostJob h{};
        cuda::RowJob& j = h.job;
        j.logits_row = inputs.prompt_first_row + static_cast<int32_t>(k);
        j.kind = cuda::kRowPrompt;
        j.temperature = request.params.temperature;
        j.top_p = request.params.top_p;
        j.top_k = request.params.top_k;
        j.golden = -1;
        j.draft_token = -1;
        j.target = inputs.prompt_targets[k];
        h.request = static_cast<int32_t>(i);
        h.index = static_cast<int32_t>(k);
        h.prompt = true;
        jobs.push_back(std::move(h));
      }
    }
  }

  // Logits: host views are copied to the device once per step.
  LogitsView device_logits = step.logits;
  if (!step.logits.on_device && !jobs.empty()) {
    const size_t bytes = static_cast<size_t>(step.logits.ByteExtent());
    RETURN_IF_ERROR(impl.logits.Reserve(bytes));
    SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(impl.logits.as<void>(), step.logits.data, bytes,
                                         cudaMemcpyHostToDevice, impl.stream));
    device_logits.data = impl.logits.as<void>();
    device_logits.on_device = true;
  } else if (step.logits.on_device && step.logits.ready_event != nullptr) {
    // The producer's event (CUDA IPC): our stream waits for it, the host does not.
    SAMPLERD_CUDA_RETURN(cudaStreamWaitEvent(
        impl.stream, static_cast<cudaEvent_t>(const_cast<void*>(step.logits.ready_event)), 0));
  }
  std::vector<cuda::RowResult> results;
  for (size_t begin = 0; begin < jobs.size(); begin += kMaxJobsPerLaunch) {
    const size_t end = std::min(jobs.size(), begin + kMaxJobsPerLaunch);
    RETURN_IF_ERROR(impl.RunJobs(step, device_logits, jobs, begin, end, results, q_rows));
  }

  // Outcomes of the sampled rows, and the prompt logprobs.
  std::vector<RowOutcome> outcomes(num_sample_jobs);
  // A row's status bits, reported in SPEC 3's order of checks (as the CPU backend does).
  auto row_error = [&](const HostJob& h, int32_t status) {
    const std::string field = RequestField(h.request);
    if (status & cuda::kRowNonFinite) return NonFiniteLogitsError(field, h.job.logits_row, V);
    if (status & cuda::kRowOverflow) return ValueOverflowError(field, h.job.logits_row);
    return NoTokenLeftError(field, h.job.logits_row);
  };
  for (size_t k = 0; k < num_sample_jobs; ++k) {
    const HostJob& h = jobs[k];
    const cuda::RowResult& r = results[k];
    RowOutcome& out = outcomes[k];
    if (r.status != 0) {
      out.status = row_error(h, r.status);
      continue;
    }
    out.accepted = r.accepted != 0;
    out.token = r.token;
    out.logprob = r.logprob;
    out.sum_smaller = r.sum_smaller;
    if (h.job.top_logprobs > 0) {
      out.top.token_ids.assign(r.top_ids, r.top_ids + h.job.top_logprobs);
      out.top.logprobs.assign(r.top_logprobs, r.top_logprobs + h.job.top_logprobs);
    }
    if (h.draft_out) out.draft_row.device = h.pool_row;
  }
  std::vector<std::vector<float>> prompt_logprobs(plan.requests.size());
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    prompt_logprobs[i].resize(step.requests[i].prompt_targets.size());
  }
  for (size_t k = num_sample_jobs; k < jobs.size(); ++k) {
    const HostJob& h = jobs[k];
    const cuda::RowResult& r = results[k];
    if (r.status != 0) {
      if (result.results[h.request].status.ok()) result.results[h.request].status = row_error(h, r.status);
      continue;
    }
    prompt_logprobs[h.request][h.index] = r.prompt_logprob;
  }
  AssembleStepResult(plan, tasks, outcomes, prompt_logprobs, impl.pool, result);
  return result;
}

}  // namespace samplerd
