// A follower rank for the multi-GPU group tests and bench: joins a group with the C++ follower
// library and, per step, optionally sends logits (FollowerLogits) then receives the step's
// packet, writing one PacketLine per step to --out. Stops at the closing packet, after
// --steps packets, or (--stall_after=K) stops taking packets after K and sleeps until killed,
// as a follower whose process hangs.
//
//   group_follower --unique_id_hex=... --world_size=2 --rank=1 --device=1 \
//       --max_step_tokens=4096 --out=/tmp/f.txt [--logits_rows=8 --logits_cols=4096]
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "client/group_follower.h"
#include "tests/group_steps.h"

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "group_follower: bad argument %s\n", argv[i]);
      return 2;
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  auto number = [&](const char* name, int fallback) {
    int value = fallback;
    if (flags.count(name) && !absl::SimpleAtoi(flags[name], &value)) value = fallback;
    return value;
  };
  samplerd::GroupFollower::Options options;
  options.unique_id = absl::HexStringToBytes(flags["unique_id_hex"]);
  options.world_size = number("world_size", 2);
  options.rank = number("rank", 1);
  options.device = number("device", 1);
  options.max_step_tokens = number("max_step_tokens", 4096);
  options.op_timeout = absl::Seconds(number("op_timeout_s", 60));
  const int steps = number("steps", 1 << 30);
  const int stall_after = number("stall_after", -1);
  const int rows = number("logits_rows", 0), cols = number("logits_cols", 0);
  auto follower = samplerd::GroupFollower::Join(options);
  if (!follower.ok()) {
    std::fprintf(stderr, "group_follower: %s\n", follower.status().ToString().c_str());
    return 1;
  }
  std::ofstream out(flags.count("out") ? flags["out"] : "/dev/stdout");
  void* device_logits = nullptr;
  const size_t logits_bytes = static_cast<size_t>(rows) * cols * 4;
  if (logits_bytes > 0 && cudaMalloc(&device_logits, logits_bytes) != cudaSuccess) return 1;
  for (int s = 0; s < steps; ++s) {
    if (s == stall_after) {
      out << "stalling" << std::endl;
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (device_logits != nullptr) {
      const std::vector<float> host = samplerd::FollowerLogits(static_cast<uint64_t>(s), rows, cols);
      cudaMemcpy(device_logits, host.data(), logits_bytes, cudaMemcpyHostToDevice);
      if (absl::Status sent = (*follower)->SendLogits(device_logits, logits_bytes); !sent.ok()) {
        std::fprintf(stderr, "group_follower: send: %s\n", sent.ToString().c_str());
        return 1;
      }
    }
    auto step = (*follower)->ReceiveStep();
    if (!step.ok()) {
      std::fprintf(stderr, "group_follower: receive: %s\n", step.status().ToString().c_str());
      return 1;
    }
    if (step->closing) {
      out << "closed" << std::endl;
      break;
    }
    out << samplerd::PacketLine(step->packet) << "\n";
  }
  out.flush();
  if (device_logits != nullptr) cudaFree(device_logits);
  return 0;
}
