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

int main(int argc, char** argv) {
  int replayed = 0;
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
    }
  }
  std::printf("replayed %d inputs\n", replayed);
  return replayed > 0 ? 0 : 1;
}
