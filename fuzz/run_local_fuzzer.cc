// Fuzz target: `samplerctl run-local`'s JSON (RunLocalJson): protobuf JSON parsing of one
// SampleRequest, an array of them or {"steps": [...]}, then the whole step path on the CPU
// backend in-process. Byte mutations with a dictionary of the JSON field names
// (fuzz/run_local.dict).
//
//   scripts/fuzz.sh run_local 600
#include <cstdint>
#include <string>

#include "client/run_local.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64 << 10)) return 0;
  samplerd::RunLocalOptions options;
  options.num_threads = 1;
  (void)samplerd::RunLocalJson(std::string(reinterpret_cast<const char*>(data), size), options);
  return 0;
}
