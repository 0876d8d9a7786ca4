#include "cuda/stage_timer.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"

#include "cuda/cuda_status.h"
#include "cuda/stage_probe.h"
#include "sampler/status_macros.h"

namespace samplerd {
namespace cuda {

StageTimer::~StageTimer() { SetStageProbe(StageProbe{}); }

absl::Status StageTimer::BeforeLaunch(cudaStream_t stream) {
  RETURN_IF_ERROR(stamps_.Reserve(kEntries * sizeof(unsigned long long)));
  SAMPLERD_CUDA_RETURN(
      cudaMemsetAsync(stamps_.as<void>(), 0, kEntries * sizeof(unsigned long long), stream));
  const size_t block_bytes = 3 * sizeof(unsigned long long) * kMaxBlocks;
  RETURN_IF_ERROR(block_stamps_.Reserve(block_bytes));
  SAMPLERD_CUDA_RETURN(cudaMemsetAsync(block_stamps_.as<void>(), 0, block_bytes, stream));
  StageProbe probe;
  probe.stage_times = stamps_.as<unsigned long long>();
  probe.block_times = block_stamps_.as<unsigned long long>();
  probe.max_blocks = kMaxBlocks;
  probe.flags = flags_;
  SAMPLERD_CUDA_RETURN(SetStageProbe(probe));
  return absl::OkStatus();
}

absl::Status StageTimer::AfterStep(bool split_ran) {
  unsigned long long t[kEntries];
  SAMPLERD_CUDA_RETURN(cudaMemcpy(t, stamps_.as<void>(), sizeof(t), cudaMemcpyDeviceToHost));
  // The split path's stages when it ran (from its job 0's chunk 0's start: that chunk loaded,
  // S1, S2, S3, its end, then the finisher's), else the fused one's.
  const int c0 = kProbeChunkBase;
  const int t0 = split_ran ? c0 : 0;
  const std::vector<int> order =
      split_ran ? std::vector<int>{c0 + 2, c0 + 3, c0 + 4, c0 + 5, c0 + 6, 15, 16, 17}
                : std::vector<int>{1, 2, 7, 3, 4, 5, 6};
  // The streaming kernel's blocks (393 KB) only where the split path ran.
  std::vector<unsigned long long> b;
  if (split_ran) {
    b.resize(3 * kMaxBlocks);
    SAMPLERD_CUDA_RETURN(cudaMemcpy(b.data(), block_stamps_.as<void>(), b.size() * sizeof(b[0]),
                                    cudaMemcpyDeviceToHost));
  }
  absl::MutexLock lock(&mu_);
  stage_us_.clear();
  for (int k : order) stage_us_.push_back(t[k] >= t[t0] ? (t[k] - t[t0]) * 1e-3 : -1.0);
  block_summary_ = split_ran ? BlockSummary(b) : "";
  chunk_summary_ = split_ran ? ChunkSummary(t) : "";
  return absl::OkStatus();
}

std::string StageTimer::ChunkSummary(const unsigned long long* t) {
  // Signed: the chunk blocks run a row's chunks side by side, so a chunk may start before the
  // one before it ends (a negative gap; their "period" is not a chain's).
  auto at = [&](int c, int s) {
    return static_cast<double>(t[kProbeChunkBase + kProbeChunkStamps * c + s]);
  };
  // The stages between consecutive stamps.
  constexpr int kStages = kProbeChunkStamps - 1;
  static const char* const kNames[kStages] = {"wait", "load", "S1", "S2", "S3", "lists"};
  double sum[kStages] = {}, gap = 0.0;
  int n = 0, gaps = 0;
  double first = 0.0, last = 0.0;
  for (int c = 1; c < kProbeChunks; ++c) {
    bool whole = true;
    for (int s = 0; s < kProbeChunkStamps; ++s) whole = whole && at(c, s) != 0.0;
    if (!whole) break;  // the row's chunks end (or a later one was not timed)
    for (int s = 0; s < kStages; ++s) sum[s] += (at(c, s + 1) - at(c, s)) * 1e-3;
    if (c + 1 < kProbeChunks && at(c + 1, 0) != 0.0) {
      gap += (at(c + 1, 0) - at(c, kStages)) * 1e-3;
      ++gaps;
    }
    if (n == 0) first = at(c, 0);
    last = at(c, kStages);
    ++n;
  }
  if (n == 0) return "";
  std::string out = absl::StrFormat("chunks 1-%d mean us:", n);
  for (int s = 0; s < kStages; ++s) out += absl::StrFormat(" %s %.2f", kNames[s], sum[s] / n);
  out += absl::StrFormat(" gap %.2f; period %.2f", gaps > 0 ? gap / gaps : 0.0,
                         (last - first) * 1e-3 / n);
  return out;
}

std::string StageTimer::last_chunk_summary() const {
  absl::MutexLock lock(&mu_);
  return chunk_summary_;
}

// The recorded blocks (start != 0): how many, on how many SMs; their start, their time and
// their end in us from the first start (p0 / p10 / p50 / p90 / p100); and the mean end of the
// blocks by how many blocks their SM ran (is the tail the SMs that ran more blocks?).
std::string StageTimer::BlockSummary(const std::vector<unsigned long long>& b) {
  std::vector<int> blocks;
  unsigned long long first = ~0ull;
  for (int i = 0; i < kMaxBlocks; ++i) {
    if (b[3 * i] != 0 && b[3 * i + 1] >= b[3 * i]) {
      blocks.push_back(i);
      first = std::min(first, b[3 * i]);
    }
  }
  if (blocks.empty()) return "";
  std::map<unsigned long long, int> per_sm;
  for (int i : blocks) ++per_sm[b[3 * i + 2]];
  auto quantiles = [&](auto value) {
    std::vector<double> v;
    for (int i : blocks) v.push_back(value(i));
    std::sort(v.begin(), v.end());
    std::string out;
    for (double q : {0.0, 0.1, 0.5, 0.9, 1.0}) {
      out += absl::StrFormat(" %.1f", v[static_cast<size_t>(q * (v.size() - 1))]);
    }
    return out;
  };
  std::string out = absl::StrFormat("blocks %d on %d SMs; start us", blocks.size(), per_sm.size());
  out += quantiles([&](int i) { return (b[3 * i] - first) * 1e-3; });
  out += "; time us" + quantiles([&](int i) { return (b[3 * i + 1] - b[3 * i]) * 1e-3; });
  out += "; end us" + quantiles([&](int i) { return (b[3 * i + 1] - first) * 1e-3; });
  std::map<int, std::pair<double, int>> by_load;  // blocks on the SM -> (sum of ends, blocks)
  for (int i : blocks) {
    auto& e = by_load[per_sm[b[3 * i + 2]]];
    e.first += (b[3 * i + 1] - first) * 1e-3;
    ++e.second;
  }
  out += "; mean end by blocks a SM:";
  for (const auto& [load, e] : by_load) {
    out += absl::StrFormat(" %d: %.1f (%d)", load, e.first / e.second, e.second);
  }
  return out;
}

std::string StageTimer::last_block_summary() const {
  absl::MutexLock lock(&mu_);
  return block_summary_;
}

std::vector<double> StageTimer::last_stage_us() const {
  absl::MutexLock lock(&mu_);
  return stage_us_;
}

}  // namespace cuda
}  // namespace samplerd
