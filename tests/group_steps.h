// What the multi-GPU group tests' driver and follower processes agree on: the logits a
// follower sends for step s (so the driver can send the same logits inline and compare), and
// the text form of a received packet (one line per step) that the follower writes.
#ifndef SAMPLERD_TESTS_GROUP_STEPS_H_
#define SAMPLERD_TESTS_GROUP_STEPS_H_

#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sampler/group_packet.h"

namespace samplerd {

inline std::vector<float> FollowerLogits(uint64_t step, int rows, int cols) {
  std::mt19937_64 rng(0x5eed0000 + step);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> out(static_cast<size_t>(rows) * cols);
  for (float& x : out) x = normal(rng);
  return out;
}

// "step_id step_status | code:accepted:t1,t2 | ..." (the same from a packet or a response).
inline std::string PacketLine(const GroupPacket& packet) {
  std::ostringstream line;
  line << packet.step_id << " " << packet.step_status_code;
  for (const PacketRequest& r : packet.requests) {
    line << " | " << r.status_code << ":" << r.num_accepted << ":";
    for (size_t i = 0; i < r.token_ids.size(); ++i) line << (i ? "," : "") << r.token_ids[i];
  }
  return line.str();
}

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_GROUP_STEPS_H_
