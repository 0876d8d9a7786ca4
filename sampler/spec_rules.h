// The rules of SPEC that every backend computes alike, written once for the CPU pipeline and
// the CUDA kernels: the counter-based random numbers (section 4), the token adjustments' and
// penalties' arithmetic (3.2, 3.3), the float32-range rule (3), the grammar mask bit (3.2), the order key of scores and
// the draft accept rule (6). Dependency-free and `__host__ __device__` under nvcc, so both
// sides include this header and nothing is written twice.
//
// Every random number samplerd uses is U(seed, seq), output `seq` of a SplitMix64 stream seeded
// with `seed`, as a float64 in [0, 1). It is a pure function, so a request's draws never depend
// on its batch slot or on other requests.
//
//   double u = UniformDouble(seed, SequenceNumber(position, DrawCase::kFresh));
#ifndef SAMPLERD_SAMPLER_SPEC_RULES_H_
#define SAMPLERD_SAMPLER_SPEC_RULES_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SAMPLERD_SPEC_FN __host__ __device__ __forceinline__
#else
#define SAMPLERD_SPEC_FN inline
#endif

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
// XTC's draw (SPEC 3 step 8) has a seed domain of its own: U(seed + this, position), with the
// seed and position of the row's fresh draw.
inline constexpr uint64_t kXtcSeedOffset = 3000000019ULL;

// Not SPEC's but this implementation's, shared by the request check (validate.cc) and the
// kernels: the longest top-N draft row a worker may send in device memory (issue 47). The
// kernels look a token's q up among the row's entries, so this bounds the lookup's cost.
inline constexpr int32_t kMaxDeviceTopNDraft = 256;

// Output number `seq` (from 0) of a SplitMix64 stream seeded with `seed`, as [0, 1).
SAMPLERD_SPEC_FN double UniformDouble(uint64_t seed, uint64_t seq) {
  uint64_t z = seed + (seq + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z = z ^ (z >> 31);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// seq = 3 * position + case, modulo 2^64.
SAMPLERD_SPEC_FN uint64_t SequenceNumber(uint64_t position, DrawCase draw_case) {
  return 3 * position + static_cast<uint64_t>(draw_case);
}

// XTC's uniform for a row whose fresh draw is U(seed, 3 * position): U(seed + kXtcSeedOffset,
// position) (SPEC 3 step 8; the row removes its top choices when this is < xtc_probability).
SAMPLERD_SPEC_FN double XtcUniform(uint64_t seed, uint64_t position) {
  return UniformDouble(seed + kXtcSeedOffset, position);
}

// Position of row `local_step` of a DECODE request whose sample_position is `sample_position`.
SAMPLERD_SPEC_FN uint64_t DecodeRowPosition(int64_t sample_position, int32_t local_step) {
  return static_cast<uint64_t>(sample_position) +
         static_cast<uint64_t>(local_step) * kDecodeRowPositionStride;
}

// Position of draft `draft_index` (1..nextn) in a DRAFT step.
SAMPLERD_SPEC_FN uint64_t DraftPosition(int64_t sample_position, int64_t last_valid_offset,
                              int32_t draft_index) {
  return static_cast<uint64_t>(sample_position) + static_cast<uint64_t>(last_valid_offset) +
         static_cast<uint64_t>(static_cast<int64_t>(draft_index));
}

// The bits of a float (memcpy on the host, a register move on the device).
SAMPLERD_SPEC_FN uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

SAMPLERD_SPEC_FN bool IsFiniteFloat(float f) { return (FloatBits(f) & 0x7F800000u) != 0x7F800000u; }

// SPEC 3.3 on one token of the history: repetition (every distinct prompt or output token:
// x > 0 ? x / r : x * r), then presence and frequency (`count` > 0: its output occurrences).
SAMPLERD_SPEC_FN float ApplyPenalty(float x, float repetition, float presence, float frequency,
                                    int32_t count) {
  if (repetition != 1.0f) x = x > 0.0f ? x / repetition : x * repetition;
  if (count > 0) x = x - (presence + frequency * static_cast<float>(count));
  return x;
}

// SPEC 3: a finite value that a step turned into +-inf is an error of its request.
SAMPLERD_SPEC_FN bool LeftFloatRange(float before, float after) {
  return IsFiniteFloat(before) && !IsFiniteFloat(after);
}

// One token's adjustments in one sampled row (SPEC 3 steps 2b-d and 3), as the host merged
// them from every source (sampler/token_updates.h): what any adjustment can do to a token is a
// ban, an addition before the penalties, the penalties, or an addition after them. Adjustments
// compose: bans win, additions add, penalty counts add. Host and device read the same struct.
enum TokenUpdateFlags : int32_t {
  kUpdateBan = 1,        // -inf (a bad word it would complete, a stop id before min_tokens)
  kUpdateBias = 2,       // `bias` is added before the penalties (step 2d's logit bias)
  kUpdatePenalize = 4,   // in the penalty history (prompt or output), the request's penalties on
  kUpdateLateBias = 8,   // `late_bias` is added after the penalties (step 3's DRY)
};
struct TokenUpdate {
  int32_t token = 0;
  int32_t flags = 0;       // TokenUpdateFlags
  float bias = 0.0f;       // kUpdateBias
  int32_t count = 0;       // occurrences in the output history (kUpdatePenalize)
  float late_bias = 0.0f;  // kUpdateLateBias
};

// A request's penalty settings (SPEC 3 step 3): repetition 1 and presence, frequency 0 = off.
struct PenaltySettings {
  float repetition = 1.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
  SAMPLERD_SPEC_FN bool on() const {
    return repetition != 1.0f || presence != 0.0f || frequency != 0.0f;
  }
};

// x + add where x is finite (-inf stays -inf), recording a finite value that left float32.
SAMPLERD_SPEC_FN float AddIfFinite(float x, float add, bool* left_range) {
  if (!IsFiniteFloat(x)) return x;
  const float y = x + add;
  *left_range = *left_range || LeftFloatRange(x, y);
  return y;
}

// SPEC 3 steps 2b-d, then 3, on one token of a sampled row: a ban makes it -inf; else its
// bias is added unless it is -inf already, then the penalties when it is in the penalty
// history, then its late bias. Sets *left_range when a finite value left the float32 range
// at any of them (SPEC 3: an error of the request).
SAMPLERD_SPEC_FN float UpdateToken(float x, const TokenUpdate& u, const PenaltySettings& penalties,
                                   bool* left_range) {
  if (u.flags & kUpdateBan) return -__builtin_huge_valf();
  if (u.flags & kUpdateBias) x = AddIfFinite(x, u.bias, left_range);
  if (u.flags & kUpdatePenalize) {
    const float y = ApplyPenalty(x, penalties.repetition, penalties.presence,
                                 penalties.frequency, u.count);
    *left_range = *left_range || LeftFloatRange(x, y);
    x = y;
  }
  if (u.flags & kUpdateLateBias) x = AddIfFinite(x, u.late_bias, left_range);
  return x;
}

// SPEC 3.2: token t is allowed when bit t % 32 of little-endian int32 word t / 32 is set,
// which is bit t % 8 of byte t / 8.
SAMPLERD_SPEC_FN bool MaskAllows(const unsigned char* mask, int32_t t) {
  return ((mask[t >> 3] >> (t & 7)) & 1u) != 0;
}

// An unsigned key whose order is the float order (-inf lowest, +inf highest; NaN never
// reaches it): the sort and selection key of scores on both backends. -0.0 takes +0.0's key:
// the two are equal values, so they tie and rank by id (as every float comparison has them),
// whatever sign a logit or x / T (+-0 for every finite x when T = +inf) carries.
SAMPLERD_SPEC_FN uint32_t OrderKey(float f) {
  const uint32_t b = FloatBits(f);
  if (b == 0x80000000u) return 0x80000000u;  // -0.0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// SPEC 3 step 6: top-p removes a token when the probability mass before it in the order
// exceeds top_p. `before` and `total` are sums of the same unnormalised weights (the mass
// before the token, and every finite token's). One rule for the CPU row processor and the
// kernels' finish from candidates.
SAMPLERD_SPEC_FN bool TopPRemoves(double before, double total, float top_p) {
  return before / total > static_cast<double>(top_p);
}

// SPEC 3 step 8: min-p removes a kept token whose probability is below min_p x the largest
// one's: with weights exp(s - max), where the largest kept weight is exactly 1, a weight below
// min_p.
SAMPLERD_SPEC_FN bool MinPRemoves(float weight, float min_p) { return weight < min_p; }

// SPEC 6: draft d (not -1) with processed probability p under the target and q under the
// draft is accepted when U < p / q (q = 0: rejected).
SAMPLERD_SPEC_FN bool AcceptDraft(int32_t draft, double u, double p, double q) {
  return draft >= 0 && q > 0.0 && u < p / q;
}

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_SPEC_RULES_H_
