// A structure-aware mutator for protobuf messages (libFuzzer's LLVMFuzzerCustomMutator):
// instead of flipping bytes of a serialized message, it changes one field somewhere in the
// message tree through reflection, with values chosen to hit edges (0, -1, 2^31, 2^62, the
// int64 limits; 0, subnormals, 1e38, 3e38, +-inf, NaN; empty and odd-sized bytes), adds and
// removes repeated elements, and switches oneofs. Debian ships no libprotobuf-mutator, so this
// is our own, small and reflection-only.
//
//   std::mt19937_64 rng(seed);
//   MutateMessage(&request_list, rng);
#ifndef SAMPLERD_FUZZ_PROTO_MUTATOR_H_
#define SAMPLERD_FUZZ_PROTO_MUTATOR_H_

#include <random>

#include "google/protobuf/message.h"

namespace samplerd {

// Applies one random mutation to `message` (or to a message nested in it, at most 6 deep).
void MutateMessage(google::protobuf::Message* message, std::mt19937_64& rng);

}  // namespace samplerd

#endif  // SAMPLERD_FUZZ_PROTO_MUTATOR_H_
