#include "sampler/extent.h"

#include "absl/strings/str_cat.h"

namespace samplerd {

absl::StatusOr<int64_t> TensorByteExtent(int64_t rows, int64_t cols, int64_t row_stride,
                                         int64_t elem_size, const std::string& field) {
  if (rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".rows: ", rows, " must be >= 1"));
  }
  if (cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".cols: ", cols, " must be >= 1"));
  }
  if (row_stride < cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".row_stride: ", row_stride, " is less than cols = ", cols));
  }
  int64_t elements = 0, bytes = 0;
  if (!CheckedMul(rows - 1, row_stride, &elements) || !CheckedAdd(elements, cols, &elements) ||
      !CheckedMul(elements, elem_size, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".row_stride: [", rows, ", ", cols, "] with row_stride ", row_stride,
        " spans more than 2^63 bytes"));
  }
  return bytes;
}

absl::Status CheckSliceWithin(int64_t offset, int64_t extent, int64_t size,
                              const std::string& field, const std::string& what) {
  // offset <= size first, so that size - offset cannot overflow.
  if (offset < 0 || extent < 0 || offset > size || extent > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": the slice of ", extent,
                                                   " bytes at offset ", offset, " exceeds ",
                                                   what));
  }
  return absl::OkStatus();
}

}  // namespace samplerd
