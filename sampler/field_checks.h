// The errors of SPEC 9 that name a request's field, and the token-id check every list of a
// request goes through: shared by the step's checks (validate.cc) and each adjustment's checks
// beside its update code (token_updates.cc).
#ifndef SAMPLERD_SAMPLER_FIELD_CHECKS_H_
#define SAMPLERD_SAMPLER_FIELD_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace samplerd {

// INVALID_ARGUMENT "field: what": how every check names the field it refused (validation
// and conversion alike).
absl::Status FieldError(const std::string& field, const std::string& what);

// Token ids of a list must lie in [0, V) (or be -1 where `allow_none`). The field is
// `field` + `suffix`, joined only for an error: a step checks a dozen lists a request, and
// building their names on the success path was most of planning's time (16 requests: 10-12 us
// before, 4-5 us after, -c opt on the 2-core machine).
absl::Status CheckTokenIds(const std::vector<int32_t>& ids, int32_t vocab_size, bool allow_none,
                           absl::string_view field, absl::string_view suffix = "");

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_FIELD_CHECKS_H_
