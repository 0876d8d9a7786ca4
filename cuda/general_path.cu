// The general path: prepare (logits -> x with padding, NaN check, grammar mask, each row's
// max), the token updates kernel (RowUpdatesKernel: adjustments and penalties), then one block
// per row job running the general algorithm
// (kernels/general.cuh). Also the step's parameter checks.
#include <cfloat>
#include <cmath>

#include "cuda/kernels/general.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

// ---------------------------------------------------------------------------------------------
// Prepare: logits -> x (padding, NaN check, grammar mask), and each row's max of x.
__global__ void __launch_bounds__(kPrepareThreads) PrepareRowsKernel(StepParams p) {
  const int job_index = blockIdx.y;
  const RowJob& job = p.jobs[job_index];
  const int V = p.vocab_size;
  const int begin = blockIdx.x * kPrepareChunk;
  const int end = min(V, begin + kPrepareChunk);
  const char* run = RowRun(p, job.logits_row, begin, end - begin);  // null: straddles shards
  float* x = p.workspace + static_cast<int64_t>(job_index) * V;
  const unsigned char* mask = RowMask(job);
  LoadStats st;
  if (run != nullptr) {
    for (int c = begin + threadIdx.x; c < end; c += kPrepareThreads) {
      x[c] = st.Admit(LoadLogit(run, p.dtype, c - begin), mask, c);
    }
  } else {
    ShardWalker walk(p, job.logits_row, begin + threadIdx.x);
    for (int c = begin + threadIdx.x; c < end; c += kPrepareThreads) {
      x[c] = st.Admit(LoadLogit(walk.At(c), p.dtype, 0), mask, c);
    }
  }
  __shared__ float scratch_f[32];
  __shared__ int scratch_i[32];
  const float local_max = BlockReduce(st.m, MaxOp(), scratch_f);
  const int bad = BlockReduce(st.bad, OrOp(), scratch_i);
  if (threadIdx.x == 0) {
    if (bad) atomicOr(reinterpret_cast<int*>(&p.results[job_index].status), kRowNonFinite);
    atomicMax(&p.row_max[job_index], OrderKey(local_max));  // max is order-independent
  }
}

// Token updates (adjustments and penalties): one thread per (job, token) entry; entries of a
// job name distinct tokens.
__global__ void RowUpdatesKernel(StepParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.num_updates) return;
  // Find the job owning entry i (jobs' ranges are sorted and disjoint).
  int lo = 0, hi = p.num_jobs - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (p.jobs[mid].update_end <= i) lo = mid + 1; else hi = mid;
  }
  const RowUpdate& u = p.updates[i];
  float* x = p.workspace + static_cast<int64_t>(lo) * p.vocab_size;
  bool left_range = false;
  x[u.update.token] = UpdateToken(x[u.update.token], u.update, u.penalties, &left_range);
  if (left_range) atomicOr(reinterpret_cast<int*>(&p.results[lo].status), kRowOverflow);
}

__global__ void __launch_bounds__(kSampleThreads) SampleRowsKernel(StepParams p) {
  __shared__ Shared sh;
  // A NaN / +inf found by the prepare kernel, or an overflow by the token updates kernel.
  if (p.results[blockIdx.x].status != 0) return;
  SampleRowGeneral(p, blockIdx.x, sh);
}

// SPEC 6 on a worker's device draft rows (issue 47; RowJob::q_check): a NaN or +inf anywhere
// in the row (a dense row's first V entries, a top-N row's values) fails its request whether
// or not verification reads that entry, as PlanStep's check of a host row. Blocks over chunks
// of each checked row; each thread keeps its first (smallest) bad entry and the row's smallest
// wins through an atomic max of its complement, so the report names the row's first fault.
__global__ void __launch_bounds__(kPrepareThreads) CheckDraftRowsKernel(StepParams p) {
  const RowJob& job = p.jobs[blockIdx.y];
  if (job.kind != kRowVerify || job.q_check == 0) return;
  const int n = job.q_n > 0 ? job.q_n : p.vocab_size;
  const int begin = blockIdx.x * kPrepareChunk;
  const int end = min(n, begin + kPrepareChunk);
  for (int c = begin + threadIdx.x; c < end; c += kPrepareThreads) {
    const float v = LoadLogit(job.q_values, job.q_dtype, c);
    if (isnan(v) || v == INFINITY) {
      const unsigned long long key = 2ull * static_cast<unsigned long long>(c) + (isnan(v) ? 1 : 0);
      atomicMax(&p.results[blockIdx.y].draft_fault, ~key);
      return;
    }
  }
}

}  // namespace detail

cudaError_t LaunchCheckDraftRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_jobs == 0) return cudaSuccess;
  // Chunks enough for the longer of a dense row (V) and the longest top-N row.
  const int longest = max(params.vocab_size, kMaxDeviceTopNDraft);
  const dim3 grid((longest + detail::kPrepareChunk - 1) / detail::kPrepareChunk, params.num_jobs);
  detail::CheckDraftRowsKernel<<<grid, detail::kPrepareThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

const char* StepParams::Validate() const {
  if (logits == nullptr) return "logits is null";
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16) return "dtype is not FLOAT32, BFLOAT16 or FLOAT16";
  if (vocab_size < 1) return "vocab_size must be >= 1";
  if (num_shards < 0 || (num_shards > 0 && shards == nullptr)) return "shards is null";
  if (num_shards == 0 && row_stride < vocab_size) return "row_stride is less than vocab_size";
  if (num_jobs < 0 || (num_jobs > 0 && jobs == nullptr)) return "jobs is null";
  if (num_updates < 0 || (num_updates > 0 && updates == nullptr)) return "updates is null";
  if (num_jobs > 0 && (workspace == nullptr || row_max == nullptr || results == nullptr)) {
    return "workspace, row_max and results are required";
  }
  if (num_split < 0 || (num_split > 0 && (split_jobs == nullptr || split_scratch == nullptr ||
                                           split_arrivals == nullptr))) {
    return "split_jobs, split_scratch and split_arrivals are required";
  }
  if (num_split > 0 && (vocab_size + kSplitChunk - 1) / kSplitChunk > detail::kSplitMaxChunks) {
    return "vocab_size has too many chunks for the split path";
  }
  if (num_fused < 0 || (num_fused > 0 && fused_jobs == nullptr)) return "fused_jobs is null";
  if (num_raw < 0 || (num_raw > 0 && raw_jobs == nullptr)) return "raw_jobs is null";
  return nullptr;
}

size_t StepParams::WorkspaceBytes(int32_t num_jobs, int32_t vocab_size) {
  return static_cast<size_t>(num_jobs) * vocab_size * sizeof(float) +
         static_cast<size_t>(num_jobs) * sizeof(unsigned int);
}

LaunchConfig PrepareRowsConfig(const StepParams& params) {
  return LaunchConfig{"PrepareRowsKernel",
                      dim3((params.vocab_size + detail::kPrepareChunk - 1) / detail::kPrepareChunk,
                           params.num_jobs),
                      dim3(detail::kPrepareThreads), 0};
}

LaunchConfig RowUpdatesConfig(const StepParams& params) {
  constexpr int kThreads = 256;
  return LaunchConfig{"RowUpdatesKernel", dim3((params.num_updates + kThreads - 1) / kThreads),
                      dim3(kThreads), 0};
}

LaunchConfig SampleRowsConfig(const StepParams& params) {
  return LaunchConfig{"SampleRowsKernel", dim3(params.num_jobs), dim3(detail::kSampleThreads), 0};
}

cudaError_t LaunchPrepareRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_jobs == 0) return cudaSuccess;
  const LaunchConfig config = PrepareRowsConfig(params);
  detail::PrepareRowsKernel<<<config.grid, config.block, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t LaunchRowUpdates(const StepParams& params, cudaStream_t stream) {
  if (params.num_updates == 0) return cudaSuccess;
  const LaunchConfig config = RowUpdatesConfig(params);
  detail::RowUpdatesKernel<<<config.grid, config.block, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t LaunchSampleRows(const StepParams& params, cudaStream_t stream) {
  if (params.num_jobs == 0) return cudaSuccess;
  const LaunchConfig config = SampleRowsConfig(params);
  detail::SampleRowsKernel<<<config.grid, config.block, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t SetStageProbeFused(const StageProbe& probe);
cudaError_t SetStageProbeSplit(const StageProbe& probe);

// The probe has one __constant__ copy per translation unit that stamps (no relocatable device
// code): set each.
cudaError_t SetStageProbe(const StageProbe& probe) {
  if (cudaError_t e = SetStageProbeFused(probe); e != cudaSuccess) return e;
  return SetStageProbeSplit(probe);
}


}  // namespace cuda
}  // namespace samplerd
