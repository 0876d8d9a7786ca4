// The step channel's shared-memory layout, as sampler.proto's OpenStepChannelRequest states it
// in words: the header's words and their offsets, the channel's states, and the futex calls
// both sides make on those words. One definition for samplerd (server/step_channel) and the C++
// client (client/sampler_client); the Python client (samplerd/channel.py) writes the same
// numbers.
//
//   std::atomic<uint32_t>* seq = channel_layout::Word(base, channel_layout::kRequestSeqAt);
//   seq->store(n, std::memory_order_release);
//   channel_layout::FutexWake(seq);
#ifndef SAMPLERD_PROTO_STEP_CHANNEL_LAYOUT_H_
#define SAMPLERD_PROTO_STEP_CHANNEL_LAYOUT_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace samplerd {
namespace channel_layout {

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "the channel's words are shared with another process");

inline constexpr uint32_t kMagic = 0x48434453;  // "SDCH"
inline constexpr uint32_t kVersion = 1;
inline constexpr int64_t kHeaderBytes = 64;  // the request area starts here
// The smallest capacity a direction may have: room for any error response samplerd writes
// (their messages are cut to fit well inside it), so a refusal always fits.
inline constexpr int64_t kMinCapacityBytes = 4096;
// Byte offsets of the header's little-endian u32 words.
enum Offset : int {
  kMagicAt = 0,
  kVersionAt = 4,
  kRequestSeqAt = 8,    // the worker increments it once a request is written
  kResponseSeqAt = 12,  // samplerd sets it to the request's sequence once answered
  kRequestLenAt = 16,
  kResponseLenAt = 20,
  kStateAt = 24,        // State
  kCapacityAt = 28,     // bytes a direction
};
enum State : uint32_t { kOpen = 0, kClosedByWorker = 1, kClosedByServer = 2 };

// The word at `offset` of the header mapped at `base`.
inline std::atomic<uint32_t>* Word(void* base, int offset) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(base) + offset);
}

// Shared futexes (not FUTEX_PRIVATE): the other process waits and wakes on the same words.
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, const timespec& timeout) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr,
          0);
}
inline void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

}  // namespace channel_layout
}  // namespace samplerd

#endif  // SAMPLERD_PROTO_STEP_CHANNEL_LAYOUT_H_
