// Verification metadata of a DECODE step (SPEC section 1): for the concatenated rows of all
// requests, which request each row belongs to, its local step, and whether it verifies a draft.
//
//   VerificationMetadata m = BuildVerificationMetadata({6, 6, 4});
//   // m.first_row == {0, 6, 12}; m.is_verify[5] == false (row q-1 is a fresh sample)
#ifndef SAMPLERD_SAMPLER_ROW_LAYOUT_H_
#define SAMPLERD_SAMPLER_ROW_LAYOUT_H_

#include <cstdint>
#include <vector>

namespace samplerd {

struct VerificationMetadata {
  std::vector<int32_t> first_row;   // ftp: first row of each request
  std::vector<int32_t> row_to_req;  // [R]
  std::vector<int32_t> local_step;  // [R]: row - ftp[req]
  std::vector<bool> is_verify;      // [R]: local_step != q - 1
};

// `seqlens_q[i]` >= 1 rows for request i, concatenated in order.
VerificationMetadata BuildVerificationMetadata(const std::vector<int32_t>& seqlens_q);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_ROW_LAYOUT_H_
