// The counter-based random numbers of SPEC section 4: U(seed, seq) and the positions.
//
// Every random number samplerd uses is U(seed, seq), output `seq` of a SplitMix64 stream seeded
// with `seed`, as a float64 in [0, 1). It is a pure function, so a request's draws never depend
// on its batch slot or on other requests.
//
//   double u = UniformDouble(seed, SequenceNumber(position, DrawCase::kFresh));
#ifndef SAMPLERD_SAMPLER_RNG_H_
#define SAMPLERD_SAMPLER_RNG_H_

#include <cstdint>

namespace samplerd {

// Which draw of a position a random number feeds (SPEC section 4).
enum class DrawCase : uint64_t {
  kFresh = 0,        // a fresh sample
  kReplacement = 1,  // the replacement after a rejected draft
  kAcceptReject = 2, // the accept/reject draw of a verified draft
};

// Multiplier that gives each DECODE row its own stream: row j uses sample_position + j * this.
inline constexpr uint64_t kDecodeRowPositionStride = 10000019ULL;
// Offset of the draft model's seed domain (tag "mtp").
inline constexpr uint64_t kDraftSeedOffset = 1000000007ULL;

// Output number `seq` (from 0) of a SplitMix64 stream seeded with `seed`, as [0, 1).
inline double UniformDouble(uint64_t seed, uint64_t seq) {
  uint64_t z = seed + (seq + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z = z ^ (z >> 31);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// seq = 3 * position + case, modulo 2^64.
inline uint64_t SequenceNumber(uint64_t position, DrawCase draw_case) {
  return 3 * position + static_cast<uint64_t>(draw_case);
}

// Position of row `local_step` of a DECODE request whose sample_position is `sample_position`.
inline uint64_t DecodeRowPosition(int64_t sample_position, int32_t local_step) {
  return static_cast<uint64_t>(sample_position) +
         static_cast<uint64_t>(local_step) * kDecodeRowPositionStride;
}

// Position of draft `draft_index` (1..nextn) in a DRAFT step.
inline uint64_t DraftPosition(int64_t sample_position, int64_t last_valid_offset,
                              int32_t draft_index) {
  return static_cast<uint64_t>(sample_position) + static_cast<uint64_t>(last_valid_offset) +
         static_cast<uint64_t>(static_cast<int64_t>(draft_index));
}

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_RNG_H_
