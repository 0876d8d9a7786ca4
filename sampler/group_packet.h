// The packed step results samplerd broadcasts to a context-parallel group's followers: one
// fixed-size buffer per step, the same bytes on every rank. Shared by the server (packing)
// and the follower libraries (unpacking); the Python follower reads the same layout.
//
// Layout, version 1: little-endian int32 words; the buffer is PacketBytes(max_step_tokens)
// long whatever the step holds (NCCL broadcasts a fixed count), unused words are zero.
//   word 0      magic 0x50474453 ("SDGP" read as bytes)
//   word 1      layout version (1)
//   words 2-3   step_id (uint64, low word first)
//   word 4      the step's status: a gRPC code; non-zero = the step failed as a whole (no
//               requests follow; the driver got the same error)
//   word 5      R, the number of requests
//   word 6      T, the total number of tokens
//   word 7      reserved (0)
//   then R x 3 words, per request in request order: status code (0 = OK), num_accepted, n
//               (its token count; 0 for a failed request)
//   then T words: every request's token ids, concatenated in request order.
// Capacity: R <= max_step_tokens and T <= max_step_tokens (a group's CreateGroup fixes it).
//
//   std::vector<int32_t> words = PackStepResult(result, max_step_tokens).value();
//   GroupPacket packet = UnpackGroupPacket(words.data(), words.size()).value();
#ifndef SAMPLERD_SAMPLER_GROUP_PACKET_H_
#define SAMPLERD_SAMPLER_GROUP_PACKET_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sampler/types.h"

namespace samplerd {

inline constexpr int32_t kGroupPacketMagic = 0x50474453;
inline constexpr int32_t kGroupPacketVersion = 1;
inline constexpr int kGroupPacketHeaderWords = 8;
inline constexpr int kGroupPacketRequestWords = 3;

// Words of a packet for a group of `max_step_tokens` (header, R <= max_step_tokens request
// entries, T <= max_step_tokens tokens); -1 if max_step_tokens is not in [1, 2^24].
int64_t GroupPacketWords(int64_t max_step_tokens);
inline int64_t GroupPacketBytes(int64_t max_step_tokens) {
  const int64_t words = GroupPacketWords(max_step_tokens);
  return words < 0 ? -1 : words * 4;
}

// One request's part of a packet.
struct PacketRequest {
  int32_t status_code = 0;  // a gRPC code
  int32_t num_accepted = 0;
  std::vector<int32_t> token_ids;
};

// A packet, unpacked.
struct GroupPacket {
  uint64_t step_id = 0;
  int32_t step_status_code = 0;
  std::vector<PacketRequest> requests;
};

// The packet of a step that produced results. INVALID_ARGUMENT when the step has more than
// max_step_tokens requests or tokens.
absl::StatusOr<std::vector<int32_t>> PackStepResult(const StepResult& result,
                                                    int64_t max_step_tokens);
// The packet of a step that failed as a whole with `status` (not OK).
std::vector<int32_t> PackStepError(uint64_t step_id, const absl::Status& status,
                                   int64_t max_step_tokens);

// Reads a packet of `words` words. INVALID_ARGUMENT names what is wrong (magic, version,
// counts that exceed the buffer).
absl::StatusOr<GroupPacket> UnpackGroupPacket(const int32_t* words, size_t num_words);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_GROUP_PACKET_H_
