#include "sampler/group_packet.h"

#include "absl/strings/str_cat.h"

namespace samplerd {
namespace {

constexpr int64_t kMaxStepTokens = int64_t{1} << 24;

std::vector<int32_t> Header(uint64_t step_id, int32_t status, int64_t max_step_tokens) {
  std::vector<int32_t> words(static_cast<size_t>(GroupPacketWords(max_step_tokens)), 0);
  words[0] = kGroupPacketMagic;
  words[1] = kGroupPacketVersion;
  words[2] = static_cast<int32_t>(static_cast<uint32_t>(step_id & 0xffffffffu));
  words[3] = static_cast<int32_t>(static_cast<uint32_t>(step_id >> 32));
  words[4] = status;
  return words;
}

}  // namespace

int64_t GroupPacketWords(int64_t max_step_tokens) {
  if (max_step_tokens < 1 || max_step_tokens > kMaxStepTokens) return -1;
  return kGroupPacketHeaderWords + max_step_tokens * (kGroupPacketRequestWords + 1);
}

absl::StatusOr<std::vector<int32_t>> PackStepResult(const StepResult& result,
                                                    int64_t max_step_tokens) {
  if (GroupPacketWords(max_step_tokens) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_step_tokens: ", max_step_tokens, " is outside [1, ", kMaxStepTokens, "]"));
  }
  const int64_t requests = static_cast<int64_t>(result.results.size());
  int64_t tokens = 0;
  for (const RequestResult& r : result.results) {
    if (r.status.ok()) tokens += static_cast<int64_t>(r.token_ids.size());
  }
  if (requests > max_step_tokens || tokens > max_step_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_id: the step has ", requests, " requests and ", tokens,
        " tokens; the group's packets hold at most max_step_tokens = ", max_step_tokens,
        " of each"));
  }
  std::vector<int32_t> words = Header(result.step_id, 0, max_step_tokens);
  words[5] = static_cast<int32_t>(requests);
  words[6] = static_cast<int32_t>(tokens);
  size_t entry = kGroupPacketHeaderWords;
  size_t token = kGroupPacketHeaderWords + static_cast<size_t>(requests) * kGroupPacketRequestWords;
  for (const RequestResult& r : result.results) {
    const bool ok = r.status.ok();
    words[entry++] = static_cast<int32_t>(r.status.code());
    words[entry++] = ok ? r.num_accepted : 0;
    words[entry++] = ok ? static_cast<int32_t>(r.token_ids.size()) : 0;
    if (!ok) continue;
    for (int32_t t : r.token_ids) words[token++] = t;
  }
  return words;
}

std::vector<int32_t> PackStepError(uint64_t step_id, const absl::Status& status,
                                   int64_t max_step_tokens) {
  const int32_t code = status.ok() ? static_cast<int32_t>(absl::StatusCode::kUnknown)
                                   : static_cast<int32_t>(status.code());
  return Header(step_id, code, max_step_tokens);
}

absl::StatusOr<GroupPacket> UnpackGroupPacket(const int32_t* words, size_t num_words) {
  if (num_words < static_cast<size_t>(kGroupPacketHeaderWords)) {
    return absl::InvalidArgumentError(
        absl::StrCat("group packet: ", num_words, " words, shorter than its header"));
  }
  if (words[0] != kGroupPacketMagic) {
    return absl::InvalidArgumentError("group packet: bad magic (not a samplerd packet)");
  }
  if (words[1] != kGroupPacketVersion) {
    return absl::InvalidArgumentError(absl::StrCat("group packet: layout version ", words[1],
                                                   "; this library reads version ",
                                                   kGroupPacketVersion));
  }
  GroupPacket packet;
  packet.step_id = static_cast<uint64_t>(static_cast<uint32_t>(words[2])) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(words[3])) << 32);
  packet.step_status_code = words[4];
  const int64_t requests = words[5], tokens = words[6];
  const int64_t room = static_cast<int64_t>(num_words) - kGroupPacketHeaderWords;
  if (requests < 0 || tokens < 0 || requests * kGroupPacketRequestWords + tokens > room) {
    return absl::InvalidArgumentError(absl::StrCat("group packet: ", requests, " requests and ",
                                                   tokens, " tokens do not fit its ", num_words,
                                                   " words"));
  }
  size_t entry = kGroupPacketHeaderWords;
  int64_t token = kGroupPacketHeaderWords + requests * kGroupPacketRequestWords;
  const int64_t token_end = token + tokens;
  packet.requests.resize(static_cast<size_t>(requests));
  for (PacketRequest& r : packet.requests) {
    r.status_code = words[entry++];
    r.num_accepted = words[entry++];
    const int32_t n = words[entry++];
    if (n < 0 || token + n > token_end) {
      return absl::InvalidArgumentError("group packet: request token counts exceed its total");
    }
    r.token_ids.assign(words + token, words + token + n);
    token += n;
  }
  if (token != token_end) {
    return absl::InvalidArgumentError("group packet: request token counts do not add up");
  }
  return packet;
}

}  // namespace samplerd
