// Benchmarks only: the kernels' stage timestamps and their stage-skipping switches, kept out
// of the production kernels and their parameters. Compiled in only where SAMPLERD_STAGE_PROBE
// is defined: the instrumented kernel archive that gpu_bench links (//cuda:cuda_backend_probed).
// In the production archive SetStageProbe answers cudaErrorNotSupported and the kernels have
// no trace of it.
//
//   SetStageProbe({stage_times_device, /*flags=*/0});   // before the steps to time
#ifndef SAMPLERD_CUDA_STAGE_PROBE_H_
#define SAMPLERD_CUDA_STAGE_PROBE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace samplerd {
namespace cuda {

// stage_times: the split kernels' chunks c < kProbeChunks of split job 0 write kProbeChunkStamps
// stamps each from kProbeChunkBase + kProbeChunkStamps * c (start, staged data arrived, loaded,
// S1, S2, S3, end).
inline constexpr int kProbeChunks = 16;
inline constexpr int kProbeChunkStamps = 7;
inline constexpr int kProbeChunkBase = 18;
inline constexpr int kProbeEntries = kProbeChunkBase + kProbeChunkStamps * kProbeChunks;

struct StageProbe {
  // The fused kernel's block 0 of its first job writes %globaltimer at its stage boundaries
  // (entries 0-8, nanoseconds), split job 0's finisher its (15-17), its chunks theirs
  // (kProbeChunkBase on). Null = off.
  unsigned long long* stage_times = nullptr;
  // Bit 0 skips the fused kernel's threshold counts, bit 1 its partial reduction (results are
  // then wrong: for timing a stage by leaving it out).
  int32_t flags = 0;
  // The streaming split kernel's blocks below max_blocks write {start, end (%globaltimer, ns),
  // SM id} at block_times[3 * block]: where its time goes between rows. Null = off.
  unsigned long long* block_times = nullptr;
  int32_t max_blocks = 0;
};

// Makes `probe` what the following launches use (a __constant__ copy).
cudaError_t SetStageProbe(const StageProbe& probe);

}  // namespace cuda
}  // namespace samplerd

#endif  // SAMPLERD_CUDA_STAGE_PROBE_H_
