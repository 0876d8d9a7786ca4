// Runs a fuzz target over files (its seed corpus and the inputs of every crash it ever found)
// without libFuzzer: the regression test that CI runs with the ordinary toolchain and under
// ASan + UBSan. Prints "replayed N inputs"; a crash fails the test.
//
//   step_fuzzer_replay_test fuzz/seeds/step fuzz/regressions/step
#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Defined by targets that run steps (step_fuzzer): how many steps of the last input reached
// the backend. A seed (a file under a "seeds" directory) must reach it, or it tests only the
// conversion's refusals.
extern "C" __attribute__((weak)) int SamplerdFuzzStepsSampled();

int main(int argc, char** argv) {
  int replayed = 0;
  std::vector<std::string> unreached;
  for (int a = 1; a < argc; ++a) {
    std::vector<std::string> files;
    if (DIR* dir = opendir(argv[a])) {
      while (dirent* entry = readdir(dir)) {
        if (entry->d_name[0] != '.') files.push_back(std::string(argv[a]) + "/" + entry->d_name);
      }
      closedir(dir);
    } else {
      files.push_back(argv[a]);
    }
    for (const std::string& file : files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) continue;
      std::stringstream bytes;
      bytes << in.rdbuf();
      const std::string input = bytes.str();
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), input.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
      ++replayed;
      if (SamplerdFuzzStepsSampled != nullptr && file.find("seeds/") != std::string::npos &&
          SamplerdFuzzStepsSampled() == 0) {
        std::fprintf(stderr, "seed %s never reaches the backend\n", file.c_str());
        unreached.push_back(file);
      }
    }
  }
  std::printf("replayed %d inputs, %zu seeds that never reach the backend\n", replayed,
              unreached.size());
  return replayed > 0 && unreached.empty() ? 0 : 1;
}
