#include "sampler/row_layout.h"

#include <cstddef>

namespace samplerd {

VerificationMetadata BuildVerificationMetadata(const std::vector<int32_t>& seqlens_q) {
  VerificationMetadata m;
  int32_t row = 0;
  for (std::size_t req = 0; req < seqlens_q.size(); ++req) {
    m.first_row.push_back(row);
    for (int32_t j = 0; j < seqlens_q[req]; ++j) {
      m.row_to_req.push_back(static_cast<int32_t>(req));
      m.local_step.push_back(j);
      m.is_verify.push_back(j != seqlens_q[req] - 1);
    }
    row += seqlens_q[req];
  }
  return m;
}

}  // namespace samplerd
