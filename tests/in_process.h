// Runs a SampleRequest through a CPU backend in this process, exactly as samplerd would (the
// same pipeline: pipeline/step_pipeline.h's RunStep), for bitwise comparison with a server's
// answers.
//
//   CpuBackend backend = ...;
//   v1::SampleResponse want = RunInProcess(backend, request);  // timing cleared
#ifndef SAMPLERD_TESTS_IN_PROCESS_H_
#define SAMPLERD_TESTS_IN_PROCESS_H_

#include "absl/status/statusor.h"
#include "samplerd/v1/sampler.pb.h"
#include "sampler/cpu_backend.h"
#include "pipeline/proto_convert.h"
#include "pipeline/step_pipeline.h"

namespace samplerd {

// Step-level faults are returned; requests must carry seq_seed (a drawn seed would differ).
inline absl::StatusOr<v1::SampleResponse> RunInProcess(CpuBackend& backend,
                                                       const v1::SampleRequest& request) {
  StepEnvironment env;  // inline logits, default limits, the pool scope ""
  env.seeds = [] { return uint64_t{0}; };
  auto result = RunStep(request, backend, env);
  if (!result.ok()) return result.status();
  v1::SampleResponse response;
  ResultToProto(*result, &response);
  return response;
}

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_IN_PROCESS_H_
