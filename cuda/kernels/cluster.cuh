// The cluster kernels (the fused path's and the RAW logprobs kernel's cluster of
// kClusterBlocks blocks per row, the row resident in their shared memory): exchanges between
// a cluster's blocks through distributed shared memory, and the launchers' shared-memory limit.
#ifndef SAMPLERD_CUDA_KERNELS_CLUSTER_CUH_
#define SAMPLERD_CUDA_KERNELS_CLUSTER_CUH_

#include <cooperative_groups.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/sampling_kernels.cuh"

namespace samplerd {
namespace cuda {
namespace detail {

namespace cg = cooperative_groups;

// Combines K values over the cluster's blocks in rank order, by `op` (SumOp, MaxOp): every
// thread of every block gets the same results, whatever the batch (a fixed order: SPEC 8's
// batch invariance). Each block's values (the same in all its threads) are published by its
// thread 0; the first barrier makes them visible, the second keeps them alive until every block
// has read them (the next call rewrites them).
template <int K, typename Op>
__device__ void ClusterCombine(cg::cluster_group& cluster, double (&v)[K], Op op) {
  __shared__ double mine[K];
  __shared__ double theirs[kClusterBlocks][K];
  if (threadIdx.x == 0) {
    for (int k = 0; k < K; ++k) mine[k] = v[k];
  }
  cluster.sync();
  for (int i = threadIdx.x; i < K * kClusterBlocks; i += blockDim.x) {
    theirs[i / K][i % K] = cluster.map_shared_rank(mine, i / K)[i % K];
  }
  cluster.sync();
  for (int k = 0; k < K; ++k) {
    double r = theirs[0][k];
    for (int b = 1; b < kClusterBlocks; ++b) r = op(r, theirs[b][k]);
    v[k] = r;
  }
}

// Lets a cluster kernel use up to kMaxFusedChunkBytes of dynamic shared memory on the current
// device, once per kernel and device. The limit is an attribute of the function, shared by
// every thread that launches it: set per launch to that launch's own size, as it once was, one
// lane's smaller value could land between another lane's set and its launch, which then failed
// with cudaErrorInvalidValue (issue 25: a V = 250 step beside V = 2 steps). The attribute only
// caps what a launch may ask for; each launch still asks for its own chunk.
inline cudaError_t AllowClusterSharedMemory(const void* kernel) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  static std::mutex mu;
  static std::vector<std::pair<const void*, int>> done;
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<const void*, int> key(kernel, device);
  if (std::find(done.begin(), done.end(), key) != done.end()) return cudaSuccess;
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kMaxFusedChunkBytes));
  if (error == cudaSuccess) done.push_back(key);
  return error;
}

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_KERNELS_CLUSTER_CUH_
