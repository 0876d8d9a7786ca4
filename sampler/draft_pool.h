// The draft pool: each request's processed draft distributions, kept by the server between a
// DRAFT step and the DECODE step that verifies those drafts (SPEC section 6; the seed's "MTP
// info pool").
//
// Entries are keyed by request_id, then by draft index i (1..nextn). A row is dense (V
// processed logprobs) or, with force top-N, N (token id, processed logprob) pairs. Capacity is
// counted in elements (a float or an id each): a dense row costs V, a top-N row 2N. The CUDA
// backend keeps its rows dense in device memory (DeviceDraftRow), V rounded up to 32 each.
//
//   DraftPool pool({.capacity_elements = 325LL * 4096 * 2});
//   RETURN_IF_ERROR(pool.Store("req-1", {{/*draft_index=*/1, std::move(row)}}));
//   ASSIGN_OR_RETURN(DraftPool::Entry entry, pool.Take("req-1"));  // frees the space
#ifndef SAMPLERD_SAMPLER_DRAFT_POOL_H_
#define SAMPLERD_SAMPLER_DRAFT_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace samplerd {

struct DraftPoolOptions {
  // Default: the seed's sizing for max_num_seqs = 64, nextn = 5 (325 rows) of a dense
  // 129,280-token vocabulary: 168 MB of float32 when full.
  int64_t capacity_elements = 325LL * 129280;
};

// A dense draft row kept in a backend's device memory (the CUDA backend's pool stays on the
// GPU between the DRAFT and the DECODE step): `data` is a device pointer to `values` processed
// logprobs, and the pool counts the `reserved` elements the backend set aside for it. The
// backend frees the memory when the last reference goes (its shared_ptr deleter).
struct DeviceDraftRow {
  const float* data = nullptr;
  int64_t values = 0;
  int64_t reserved = 0;
};

// One draft row's processed distribution: on the host, or (`device` set, the vectors empty)
// on the device.
struct DraftRow {
  std::vector<float> logprobs;     // dense: V values; top-N: N values
  std::vector<int32_t> token_ids;  // empty = dense; else N ids matching `logprobs`
  std::shared_ptr<const DeviceDraftRow> device;
  // Dense rows: how many logprobs the row holds (V when it fits the step).
  int64_t DenseValues() const {
    return device ? device->values : static_cast<int64_t>(logprobs.size());
  }
  int64_t Elements() const {
    return device ? device->reserved : static_cast<int64_t>(logprobs.size() + token_ids.size());
  }
};

class DraftPool {
 public:
  using Entry = std::map<int32_t, DraftRow>;  // draft index -> row

  explicit DraftPool(const DraftPoolOptions& options) : options_(options) {}
  DraftPool(const DraftPool&) = delete;
  DraftPool& operator=(const DraftPool&) = delete;

  // Stores (or replaces) the given draft rows of `request_id`, all or none.
  // RESOURCE_EXHAUSTED when they do not fit in the remaining capacity.
  absl::Status Store(const std::string& request_id, std::vector<std::pair<int32_t, DraftRow>> rows);

  // Removes and returns every draft row of `request_id`, freeing their space.
  // FAILED_PRECONDITION when the pool holds none for it.
  absl::StatusOr<Entry> Take(const std::string& request_id);

  // Drops `request_id`'s rows, if any (a finished or aborted request). Returns rows dropped.
  int Release(const std::string& request_id);

  int64_t UsedElements() const;
  int64_t CapacityElements() const { return options_.capacity_elements; }

 private:
  const DraftPoolOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_DRAFT_POOL_H_
