// samplerctl: the samplerd command-line tool.
//
//   samplerctl run-local FILE [--threads=N]   run FILE's SampleRequest JSON in-process (CPU
//                                             backend) and print the SampleResponse JSON
//
// FILE may be "-" for standard input. Exit status: 0 on success, 2 for bad usage, 1 for an
// unreadable file, bad JSON or a failed step (the reason goes to stderr).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "client/run_local.h"

namespace {

constexpr char kUsage[] =
    "usage: samplerctl run-local FILE [--threads=N]\n"
    "  run-local  run SampleRequest JSON (one object, an array, or {\"steps\": [...]}) through\n"
    "             the CPU backend in-process; print the SampleResponse JSON\n";

int RunLocal(int argc, char** argv) {
  std::string path;
  samplerd::RunLocalOptions options;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--threads=")) {
      if (!absl::SimpleAtoi(arg.substr(10), &options.num_threads) || options.num_threads < 0) {
        std::cerr << "samplerctl: --threads needs a number >= 0\n";
        return 2;
      }
    } else if (path.empty()) {
      path = arg;
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  if (path.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream file(path);
    if (!file) {
      std::cerr << "samplerctl: cannot read " << path << "\n";
      return 1;
    }
    text << file.rdbuf();
  }
  auto out = samplerd::RunLocalJson(text.str(), options);
  if (!out.ok()) {
    std::cerr << "samplerctl: " << out.status().message() << "\n";
    return 1;
  }
  std::cout << *out;
  if (!out->empty() && out->back() != '\n') std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  if (command == "run-local") return RunLocal(argc, argv);
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << kUsage;
    return 0;
  }
  std::cerr << "samplerctl: unknown command '" << command << "'\n" << kUsage;
  return 2;
}
