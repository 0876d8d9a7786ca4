// `samplerctl run-local`: runs SampleRequests given as protobuf JSON through the CPU backend
// in-process and answers SampleResponses as protobuf JSON. The first way to run the sampler,
// with no server.
//
//   ASSIGN_OR_RETURN(std::string out, RunLocalJson(json_text, RunLocalOptions{}));
//
// Input: one SampleRequest object, a JSON array of them, or {"steps": [...]}; steps run in
// order on one backend, so the draft pool carries from a DRAFT step to the next DECODE step.
// Output: one SampleResponse object for one request, else a JSON array.
#ifndef SAMPLERD_CLIENT_RUN_LOCAL_H_
#define SAMPLERD_CLIENT_RUN_LOCAL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "samplerd/v1/sampler.pb.h"

namespace samplerd {

struct RunLocalOptions {
  int num_threads = 0;           // CPU backend workers; 0 = all cores
  int32_t max_top_logprobs = 64; // the server's default limit
};

// Parses FILE's text: one SampleRequest (`single` set), a JSON array, or {"steps": [...]}.
// Errors: INVALID_ARGUMENT with the parser's message.
absl::StatusOr<v1::SampleRequestList> ParseStepsJson(const std::string& json, bool* single);

// Errors: INVALID_ARGUMENT for JSON that does not parse as the messages above (the parser's
// message says where), or for a step that fails as a whole (the message names the field and
// the step's index). Per-request faults are answered in that request's `status`.
absl::StatusOr<std::string> RunLocalJson(const std::string& json, const RunLocalOptions& options);

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_RUN_LOCAL_H_
