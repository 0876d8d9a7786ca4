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
  // Frees the memory (a rebuilt lane starts from nothing).
  void Release() {
    if (ptr_ != nullptr) kFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

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
// kernels never read a freed range: the step that writes a row (DRAFT) or reads it (DECODE)
// holds its reference until its own stream has finished, whatever runs on the other lanes.
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

namespace {

// Rounds `bytes` up to a 256-byte boundary: every array of a lane's input block starts aligned.
size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// One step in flight: its own stream, events and per-step buffers. Steps on different lanes
// overlap (one step's host work and copies with another's kernels); a lane runs one step at a
// time. Buffers grow to the largest step the lane has run and are then reused: a step of a
// size seen before allocates nothing.
struct Lane {
  explicit Lane(int index) : index(index) {}
  ~Lane() { Destroy(); }
  absl::Status Init() {
    SAMPLERD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    SAMPLERD_CUDA_RETURN(cudaEventCreate(&start));
    SAMPLERD_CUDA_RETURN(cudaEventCreate(&stop));
    return absl::OkStatus();
  }
  void Destroy() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
    start = stop = nullptr;
    stream = nullptr;
  }

  // After a step failed on this lane with a CUDA error (no request's fault: those are in the
  // requests' results): makes the lane safe for the next step. Waits for what its stream still
  // had queued (the next step reuses the staging block and the buffers those copies and kernels
  // use), clears this thread's error, and zeroes the split path's arrival counters (a chunk
  // kernel that stopped part-way would leave them non-zero). Where the stream cannot be waited
  // for, the lane is rebuilt: new stream and events, every buffer freed. OK when the lane is
  // usable; otherwise the reason, and `broken` is set so that the next step on it tries again
  // before using it. An error that poisons the whole context (e.g. an illegal address) makes
  // every later step fail with INTERNAL; only a restart clears it.
  absl::Status Recover() {
    cudaError_t error = stream != nullptr ? cudaStreamSynchronize(stream) : cudaErrorInvalidValue;
    cudaGetLastError();
    if (error == cudaSuccess && split_arrival_slots > 0) {
      error = cudaMemsetAsync(split_arrivals_d.as<void>(), 0,
                              split_arrival_slots * sizeof(unsigned int), stream);
      if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
    }
    if (error == cudaSuccess) {
      broken = false;
      return absl::OkStatus();
    }
    cudaGetLastError();
    Destroy();
    logits.Release();
    inputs_d.Release();
    workspace.Release();
    split_d.Release();
    split_arrivals_d.Release();
    split_arrival_slots = 0;
    staging.Release();
    stage_d.Release();
    absl::Status rebuilt = Init();
    broken = !rebuilt.ok();
    if (broken) Destroy();
    return rebuilt;
  }

  const int index;  // in CudaBackend::Impl::lanes, for error messages
  bool broken = false;  // Recover failed: rebuild before the next step uses it
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  // logits: host logits copied to the device. inputs_d: everything else a launch reads or
  // zero-fills, as one block (jobs, job lists, token updates, masks, q rows, results, row
  // maxima) staged in `staging` with the same layout and sent with one copy.
  DeviceBuffer logits, inputs_d, workspace, split_d;
  // The split path's per-row arrival counters: zeroed when allocated, and every launch leaves
  // them zero (cuda::StepParams::split_arrivals), so no per-step memset.
  DeviceBuffer split_arrivals_d;
  int split_arrival_slots = 0;
  PinnedBuffer staging;
  std::vector<cuda::RowUpdate> updates;  // the launch's token updates, reused step to step
  DeviceBuffer stage_d;                  // benchmarks: the instrumented kernels' stamps
};

std::string DimText(const dim3& d) { return absl::StrCat(d.x, "x", d.y, "x", d.z); }

// What a failed launch was: every launch of the step's path with its grid, block and dynamic
// shared memory, the lane, and the step's shapes (issue 25 asks for it in the log; the service
// logs the step's error).
std::string DescribeLaunch(const cuda::StepParams& params, bool fused_fits, const Lane& lane,
                           const Step& step, int masks, int q_rows) {
  std::vector<cuda::LaunchConfig> configs;
  if (fused_fits) {
    configs = {cuda::SplitRowsConfig(params), cuda::FusedRowsConfig(params)};
  } else {
    configs = {cuda::PrepareRowsConfig(params), cuda::RowUpdatesConfig(params),
               cuda::SampleRowsConfig(params)};
  }
  std::string out = absl::StrCat("launch on lane ", lane.index, ":");
  for (const cuda::LaunchConfig& c : configs) {
    absl::StrAppend(&out, " ", c.kernel, " grid ", DimText(c.grid), " block ", DimText(c.block),
                    " smem ", c.dynamic_smem, " B;");
  }
  absl::StrAppend(&out, " step ", StepKindName(step.kind), " vocab_size ", params.vocab_size,
                  " logits [", step.logits.rows, ", ", step.logits.cols, "] row_stride ",
                  params.row_stride, " ", DTypeName(step.logits.dtype),
                  step.logits.on_device ? " (device)" : " (host)", ", jobs ", params.num_jobs,
                  " (split ", params.num_split, ", fused ", params.num_fused, "), updates ",
                  params.num_updates, ", masks ", masks, ", host q rows ", q_rows,
                  ", force_top_n ", step.force_top_n);
  return out;
}

}  // namespace

struct CudaBackend::Impl {
  explicit Impl(const CudaBackendOptions& options)
      : options(options),
        draft_store(std::make_shared<DeviceDraftStore>(options.draft_pool.capacity_bytes /
                                                      static_cast<int64_t>(sizeof(float)))),
        pool(options.draft_pool) {}

  absl::Status Init() {
    SAMPLERD_CUDA_RETURN(cudaSetDevice(options.device));
    cudaDeviceProp prop;
    SAMPLERD_CUDA_RETURN(cudaGetDeviceProperties(&prop, options.device));
    device_name = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", device ",
                               options.device, ")");
    const int count = std::max(1, options.streams);
    for (int i = 0; i < count; ++i) {
      auto lane = std::make_unique<Lane>(i);
      RETURN_IF_ERROR(lane->Init());
      free_lanes.push_back(lane.get());
      lanes.push_back(std::move(lane));
    }
    return absl::OkStatus();
  }

  // Blocks until a lane is free. Callers beyond the lanes wait here (the service admits at
  // most max_concurrent_steps(), so in the server they never do).
  Lane* AcquireLane() {
    absl::MutexLock lock(&lanes_mu);
    lanes_mu.Await(absl::Condition(
        +[](std::vector<Lane*>* free) { return !free->empty(); }, &free_lanes));
    Lane* lane = free_lanes.back();
    free_lanes.pop_back();
    return lane;
  }
  bool TakeInjectedFailure() {
    int left = launch_failures.load();
    while (left > 0 && !launch_failures.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  }
  void ReleaseLane(Lane* lane) {
    absl::MutexLock lock(&lanes_mu);
    free_lanes.push_back(lane);
  }

  // Runs jobs [begin, end) on `lane`; appends their results and adds the launches' device
  // time to *kernel_us.
  absl::Status RunJobs(Lane& lane, const Step& step, const LogitsView& device_logits,
                       std::vector<HostJob>& jobs, size_t begin, size_t end,
                       std::vector<cuda::RowResult>& results,
                       const std::vector<std::vector<float>>& q_rows_host, float* kernel_us);

  const CudaBackendOptions options;
  // Declared before the pool: the pool's rows free themselves into the store (which their
  // deleters also keep alive).
  std::shared_ptr<DeviceDraftStore> draft_store;
  DraftPool pool;
  std::string device_name;
  std::vector<std::unique_ptr<Lane>> lanes;
  absl::Mutex lanes_mu;
  std::vector<Lane*> free_lanes ABSL_GUARDED_BY(lanes_mu);
  // Tests: how many of the next launch points fail with a real CUDA error (InjectLaunchFailures).
  std::atomic<int> launch_failures{0};
  // Benchmarks only (set between steps, read by the step's thread).
  std::atomic<bool> stage_timing{false};
  std::atomic<int> debug_flags{0};
  absl::Mutex stage_mu;
  std::vector<double> stage_us ABSL_GUARDED_BY(stage_mu);
};

absl::Status CudaBackend::Impl::RunJobs(Lane& lane, const Step& step,
                                        const LogitsView& device_logits,
                                        std::vector<HostJob>& jobs, size_t begin, size_t end,
                                        std::vector<cuda::RowResult>& results,
                                        const std::vector<std::vector<float>>& q_rows_host,
                                        float* kernel_us) {
  const int32_t V = step.vocab_size;
  const int n = static_cast<int>(end - begin);
  const size_t mask_bytes = 4 * ((static_cast<size_t>(V) + 31) / 32);
  int masks = 0, verifies = 0;  // verifies: q rows uploaded from the host
  std::vector<cuda::RowUpdate>& updates = lane.updates;  // every job's updates, job after job
  updates.clear();
  for (size_t i = begin; i < end; ++i) {
    HostJob& h = jobs[i];
    masks += h.mask != nullptr;
    verifies += h.q_host >= 0;
    h.job.update_begin = static_cast<int32_t>(updates.size());
    updates.insert(updates.end(), h.updates.begin(), h.updates.end());
    h.job.update_end = static_cast<int32_t>(updates.size());
  }

  // The input block's layout, the same in pinned staging and on the device. The sizes are
  // bounded by the step's limits (rows, V, token lists), far from overflowing size_t.
  const size_t job_bytes = n * sizeof(cuda::RowJob);
  const size_t list_bytes = n * sizeof(int32_t);  // split_jobs, then fused_jobs
  const size_t update_bytes = updates.size() * sizeof(cuda::RowUpdate);
  const size_t q_bytes = static_cast<size_t>(verifies) * V * sizeof(float);
  const size_t result_bytes = n * sizeof(cuda::RowResult);
  const size_t at_lists = Align256(job_bytes);
  const size_t at_updates = at_lists + Align256(list_bytes);
  const size_t at_masks = at_updates + Align256(update_bytes);
  const size_t at_q = at_masks + Align256(masks * mask_bytes);
  const size_t at_results = at_q + Align256(q_bytes);
  const size_t at_row_max = at_results + Align256(result_bytes);
  const size_t block_bytes = at_row_max + Align256(n * sizeof(unsigned int));
  RETURN_IF_ERROR(lane.staging.Reserve(block_bytes));
  RETURN_IF_ERROR(lane.inputs_d.Reserve(block_bytes));
  RETURN_IF_ERROR(lane.workspace.Reserve(cuda::StepParams::WorkspaceBytes(n, V)));
  char* stage = lane.staging.as<char>();
  char* device = lane.inputs_d.as<char>();
  auto* job_stage = reinterpret_cast<cuda::RowJob*>(stage);
  auto* list_stage = reinterpret_cast<int32_t*>(stage + at_lists);
  if (update_bytes > 0) std::memcpy(stage + at_updates, updates.data(), update_bytes);
  // Results start zeroed (no status bits) and the row maxima at the smallest order key.
  std::memset(stage + at_results, 0, block_bytes - at_results);
  int m = 0, qv = 0;
  for (int k = 0; k < n; ++k) {
    HostJob& h = jobs[begin + k];
    cuda::RowJob job = h.job;
    job.mask = nullptr;
    job.q_dense = nullptr;
    job.pool_out = nullptr;
    if (h.mask != nullptr) {
      std::memcpy(stage + at_masks + m * mask_bytes, h.mask, mask_bytes);
      job.mask = reinterpret_cast<const unsigned char*>(device + at_masks + m * mask_bytes);
      ++m;
    }
    if (h.q_device != nullptr) {
      job.q_dense = h.q_device;
    } else if (h.q_host >= 0) {
      const size_t at = at_q + static_cast<size_t>(qv) * V * sizeof(float);
      std::memcpy(stage + at, q_rows_host[h.q_host].data(), V * sizeof(float));
      job.q_dense = reinterpret_cast<const float*>(device + at);
      ++qv;
    }
    // A DRAFT row whose device range could not be had (its request has failed) writes nothing.
    if (h.pool_row != nullptr) job.pool_out = const_cast<float*>(h.pool_row->data);
    job_stage[k] = job;
  }
  // Each job's path from its own parameters (never from the batch): split, else fused.
  const int flags = debug_flags.load();
  const bool fused_fits = cuda::FusedPathFits(V);
  const bool split_on = fused_fits && (flags & CudaBackend::kDebugNoSplitPath) == 0;
  int num_split = 0;
  for (int k = 0; k < n; ++k) {
    if (split_on && cuda::SplitPathEligible(job_stage[k], V)) list_stage[num_split++] = k;
  }
  int num_fused = num_split;
  for (int k = 0; k < n; ++k) {
    if (!(split_on && cuda::SplitPathEligible(job_stage[k], V))) list_stage[num_fused++] = k;
  }
  num_fused -= num_split;
  RETURN_IF_ERROR(lane.split_d.Reserve(cuda::SplitScratchBytes(num_split, V)));
  if (num_split > lane.split_arrival_slots) {
    RETURN_IF_ERROR(lane.split_arrivals_d.Reserve(num_split * sizeof(unsigned int)));
    SAMPLERD_CUDA_RETURN(cudaMemsetAsync(lane.split_arrivals_d.as<void>(), 0,
                                         num_split * sizeof(unsigned int), lane.stream));
    lane.split_arrival_slots = num_split;
  }
  // Everything the launches read, in one copy.
  SAMPLERD_CUDA_RETURN(
      cudaMemcpyAsync(device, stage, block_bytes, cudaMemcpyHostToDevice, lane.stream));

  cuda::StepParams params;
  params.logits = device_logits.data;
  params.dtype = DTypeCode(device_logits.dtype);
  params.row_stride = device_logits.row_stride;
  params.vocab_size = V;
  params.jobs = reinterpret_cast<const cuda::RowJob*>(device);
  params.num_jobs = n;
  params.updates = reinterpret_cast<const cuda::RowUpdate*>(device + at_updates);
  params.num_updates = static_cast<int32_t>(updates.size());
  params.workspace = lane.workspace.as<float>();
  params.row_max = reinterpret_cast<unsigned int*>(device + at_row_max);
  params.results = reinterpret_cast<cuda::RowResult*>(device + at_results);
  if (fused_fits) {
    const auto* lists = reinterpret_cast<const int32_t*>(device + at_lists);
    params.split_jobs = lists;
    params.num_split = num_split;
    params.split_scratch = lane.split_d.as<void>();
    params.split_arrivals = lane.split_arrivals_d.as<unsigned int>();
    params.fused_jobs = lists + num_split;
    params.num_fused = num_fused;
  }
  const bool timing = stage_timing.load();
  if (timing) {
    // Benchmarks only: the instrumented kernels (//cuda:cuda_backend_probed) stamp their stages.
    RETURN_IF_ERROR(lane.stage_d.Reserve(kStageEntries * sizeof(unsigned long long)));
    SAMPLERD_CUDA_RETURN(cudaMemsetAsync(lane.stage_d.as<void>(), 0,
                                         kStageEntries * sizeof(unsigned long long), lane.stream));
    cuda::StageProbe probe;
    probe.stage_times = lane.stage_d.as<unsigned long long>();
    probe.flags = flags & 0xff;
    SAMPLERD_CUDA_RETURN(cuda::SetStageProbe(probe));
  }
  if (const char* invalid = params.Validate(); invalid != nullptr) {
    return absl::InternalError(absl::StrCat("cuda step params: ", invalid));
  }
  SAMPLERD_CUDA_RETURN(cudaEventRecord(lane.start, lane.stream));
  absl::Status launched = [&]() -> absl::Status {
    if (TakeInjectedFailure()) {
      // Tests only: a real CUDA error (an invalid argument, as issue 25's failed launch had)
      // where the launches are, after this launch's inputs were queued on the stream.
      SAMPLERD_CUDA_RETURN(cudaMemsetAsync(nullptr, 0, 16, lane.stream));
    }
    if (fused_fits) {
      // Rows with a small top-k: independent blocks over chunks of each row, the last of which
      // finishes the row. The rest: one read of each row by a cluster of blocks, which also runs
      // the general algorithm for the rows its candidates cannot finish.
      SAMPLERD_CUDA_RETURN(cuda::LaunchSplitRows(params, lane.stream));
      SAMPLERD_CUDA_RETURN(cuda::LaunchFusedRows(params, lane.stream));
    } else {
      SAMPLERD_CUDA_RETURN(cuda::LaunchPrepareRows(params, lane.stream));
      SAMPLERD_CUDA_RETURN(cuda::LaunchRowUpdates(params, lane.stream));
      SAMPLERD_CUDA_RETURN(cuda::LaunchSampleRows(params, lane.stream));
    }
    return absl::OkStatus();
  }();
  if (!launched.ok()) {
    return absl::Status(launched.code(),
                        absl::StrCat(launched.message(), "; ",
                                     DescribeLaunch(params, fused_fits, lane, step, masks, verifies)));
  }
  SAMPLERD_CUDA_RETURN(cudaEventRecord(lane.stop, lane.stream));
  // The results come back into the staging block they were zeroed in: pinned, read once below.
  SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(stage + at_results, device + at_results, result_bytes,
                                       cudaMemcpyDeviceToHost, lane.stream));
  SAMPLERD_CUDA_RETURN(cudaStreamSynchronize(lane.stream));  // this stream only, never the device
  if (timing) {
    unsigned long long t[kStageEntries];
    SAMPLERD_CUDA_RETURN(cudaMemcpy(t, lane.stage_d.as<void>(), sizeof(t), cudaMemcpyDeviceToHost));
    // The split path's stages when it ran (from its chunk kernel's start), else the fused one's.
    const int t0 = num_split > 0 ? 9 : 0;
    const std::vector<int> order = num_split > 0 ? std::vector<int>{10, 11, 12, 13, 14, 15, 16, 17}
                                                 : std::vector<int>{1, 2, 7, 3, 4, 5, 6};
    absl::MutexLock lock(&stage_mu);
    stage_us.clear();
    for (int k : order) stage_us.push_back(t[k] >= t[t0] ? (t[k] - t[t0]) * 1e-3 : -1.0);
  }
  float ms = 0.0f;
  SAMPLERD_CUDA_RETURN(cudaEventElapsedTime(&ms, lane.start, lane.stop));
  *kernel_us += ms * 1000.0f;
  const auto* r = reinterpret_cast<const cuda::RowResult*>(stage + at_results);
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
int CudaBackend::max_concurrent_steps() const { return static_cast<int>(impl_->lanes.size()); }
void CudaBackend::set_stage_timing(bool on, int debug_flags) {
  impl_->stage_timing.store(on);
  impl_->debug_flags.store(debug_flags);
  // Off: the probe points nowhere again (the production kernels have none: an error, ignored).
  if (!on) cuda::SetStageProbe(cuda::StageProbe{});
}
void CudaBackend::InjectLaunchFailures(int count) { impl_->launch_failures.store(count); }
std::vector<double> CudaBackend::last_stage_us() const {
  absl::MutexLock lock(&impl_->stage_mu);
  return impl_->stage_us;
}

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
  SAMPLERD_CUDA_RETURN(cudaSetDevice(impl.options.device));
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
        // PlanStep and TakeDecodeDrafts have refused rows holding NaN or +inf (SPEC 6,
        // CheckDraftRow), the same rule as on the CPU backend.
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

  // The device part of the step runs on a free lane; the host work above overlapped with
  // other steps' kernels.
  Lane* lane = impl.AcquireLane();
  struct LaneGuard {
    Impl& impl;
    Lane* lane;
    ~LaneGuard() { impl.ReleaseLane(lane); }
  } lane_guard{impl, lane};
  std::vector<cuda::RowResult> results;
  results.reserve(jobs.size());
  float kernel_us = 0.0f;
  absl::Status device_status = [&]() -> absl::Status {
    if (lane->broken) RETURN_IF_ERROR(lane->Recover());
    // Logits: host views are copied to the device once per step (at full PCIe speed when the
    // host memory is pinned: a registered shm region).
    LogitsView device_logits = step.logits;
    if (!step.logits.on_device && !jobs.empty()) {
      const size_t bytes = static_cast<size_t>(step.logits.ByteExtent());
      RETURN_IF_ERROR(lane->logits.Reserve(bytes));
      SAMPLERD_CUDA_RETURN(cudaMemcpyAsync(lane->logits.as<void>(), step.logits.data, bytes,
                                           cudaMemcpyHostToDevice, lane->stream));
      device_logits.data = lane->logits.as<void>();
      device_logits.on_device = true;
    } else if (step.logits.on_device && step.logits.ready_event != nullptr) {
      // The producer's event (CUDA IPC): our stream waits for it, the host does not.
      SAMPLERD_CUDA_RETURN(cudaStreamWaitEvent(
          lane->stream, static_cast<cudaEvent_t>(const_cast<void*>(step.logits.ready_event)), 0));
    }
    for (size_t begin = 0; begin < jobs.size(); begin += kMaxJobsPerLaunch) {
      const size_t end = std::min(jobs.size(), begin + kMaxJobsPerLaunch);
      RETURN_IF_ERROR(impl.RunJobs(*lane, step, device_logits, jobs, begin, end, results, q_rows,
                                   &kernel_us));
    }
    return absl::OkStatus();
  }();
  if (!device_status.ok()) {
    // The step fails as a whole (its error names the call and, for a launch, the launch); the
    // lane is made usable for the next step before it is released.
    const absl::Status recovered = lane->Recover();
    if (!recovered.ok()) {
      return absl::Status(device_status.code(),
                          absl::StrCat(device_status.message(), "; lane ", lane->index,
                                       " could not be rebuilt: ", recovered.message()));
    }
    return device_status;
  }
  result.kernel_us = kernel_us;

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
