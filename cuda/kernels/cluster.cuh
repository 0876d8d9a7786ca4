// Exchanges between the blocks of one thread-block cluster (the fused path's and the RAW
// logprobs kernel's cluster of kClusterBlocks blocks per row) through distributed shared memory.
#ifndef SAMPLERD_CUDA_KERNELS_CLUSTER_CUH_
#define SAMPLERD_CUDA_KERNELS_CLUSTER_CUH_

#include <cooperative_groups.h>

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

}  // namespace detail
}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_KERNELS_CLUSTER_CUH_
