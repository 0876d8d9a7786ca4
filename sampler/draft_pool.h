// The draft pool: each request's processed draft distributions, kept by the server between a
// DRAFT step and the DECODE step that verifies those drafts (SPEC section 6; the seed's "MTP
// info pool").
//
// Entries are keyed by DraftPoolKey(scope, request_id), then by draft index i (1..nextn): the
// scope is the client's (the service derives it from the caller), so two clients that use the
// same request ids never see each other's drafts. A row is dense (V processed logprobs) or,
// with force top-N, N (token id, processed logprob) pairs. Capacity is in bytes and counts
// what an entry really costs: its values and ids, and the bookkeeping of every row and entry
// (kRowOverheadBytes, kEntryOverheadBytes plus the key). The CUDA backend keeps its rows dense
// in device memory (DeviceDraftRow), V rounded up to 32 each; the pool counts those bytes.
// An entry not taken within `ttl` of its last Store expires (a worker that crashed between
// DRAFT and DECODE cannot fill the pool for good).
//
//   DraftPool pool({.capacity_bytes = 64 << 20});
//   const std::string key = DraftPoolKey(scope, "req-1");
//   RETURN_IF_ERROR(pool.Store(key, {{/*draft_index=*/1, std::move(row)}}));
//   ASSIGN_OR_RETURN(DraftPool::Entry entry, pool.Take(key));  // frees the space
#ifndef SAMPLERD_SAMPLER_DRAFT_POOL_H_
#define SAMPLERD_SAMPLER_DRAFT_POOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace samplerd {

struct DraftPoolOptions {
  // Default: the seed's sizing for max_num_seqs = 64, nextn = 5 (325 rows) of a dense
  // 129,280-token vocabulary in float32, 168 MB, with room for the rows' bookkeeping.
  int64_t capacity_bytes = 325LL * (129280 * 4 + 256);
  // Entries expire this long after their last Store.
  absl::Duration ttl = absl::Seconds(60);
  // The clock (tests inject one); null = absl::Now.
  std::function<absl::Time()> now;
};

// The pool key of `request_id` for a client `scope`; the two parts cannot run into each other.
std::string DraftPoolKey(const std::string& scope, const std::string& request_id);

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
  // Bytes the row costs the pool: its values (host vectors by capacity, device rows by their
  // reserved range) and its bookkeeping.
  int64_t Bytes() const;
};

// The bookkeeping a row and an entry cost beside their values (map nodes, the row struct, a
// hash slot): measured upper bounds on 64-bit Linux, so that the capacity is what the flag says.
inline constexpr int64_t kRowOverheadBytes = 128;
inline constexpr int64_t kEntryOverheadBytes = 128;

class DraftPool {
 public:
  using Entry = std::map<int32_t, DraftRow>;  // draft index -> row

  explicit DraftPool(const DraftPoolOptions& options) : options_(options) {}
  DraftPool(const DraftPool&) = delete;
  DraftPool& operator=(const DraftPool&) = delete;

  // Stores (or replaces) the given draft rows under `key`, all or none, and restarts the
  // entry's time to live. Expired entries are dropped first. RESOURCE_EXHAUSTED when the rows
  // do not fit in the remaining capacity.
  absl::Status Store(const std::string& key, std::vector<std::pair<int32_t, DraftRow>> rows);

  // Removes and returns every draft row under `key`, freeing their space.
  // FAILED_PRECONDITION when the pool holds none (never stored, taken, released or expired).
  absl::StatusOr<Entry> Take(const std::string& key);

  // Drops the rows under `key`, if any (a finished or aborted request). Returns rows dropped.
  int Release(const std::string& key);

  // Drops every expired entry now (Store does this too). Returns entries dropped.
  int Expire();

  int64_t UsedBytes() const;
  int64_t CapacityBytes() const { return options_.capacity_bytes; }
  absl::Duration Ttl() const { return options_.ttl; }
  int Entries() const;

 private:
  struct Stored {
    Entry rows;
    absl::Time expires;
    int64_t bytes = 0;  // rows and bookkeeping, key included
  };
  absl::Time Now() const { return options_.now ? options_.now() : absl::Now(); }
  int ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DraftPoolOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Stored> entries_ ABSL_GUARDED_BY(mu_);
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_DRAFT_POOL_H_
