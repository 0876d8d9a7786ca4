// Overflow-checked sizes: the one place where the byte extent of a client-described tensor and
// the bounds of a slice of a buffer are computed. Every size or offset a client controls goes
// through these before anything is allocated or read.
//
//   ASSIGN_OR_RETURN(int64_t bytes, TensorByteExtent(rows, cols, stride, 4, "logits"));
//   RETURN_IF_ERROR(CheckSliceWithin(offset, bytes, region_size, "logits.buffer.byte_offset"));
#ifndef SAMPLERD_SAMPLER_EXTENT_H_
#define SAMPLERD_SAMPLER_EXTENT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace samplerd {

// *out = a * b, a + b; false (and *out untouched) when the exact result is not an int64.
inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool CheckedAdd(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// The bytes that a [rows, cols] matrix of `elem_size`-byte elements spans when its rows start
// `row_stride` elements apart: ((rows - 1) * row_stride + cols) * elem_size. INVALID_ARGUMENT
// naming `field` (".rows", ".cols", ".row_stride") when rows < 1, cols < 1, row_stride < cols,
// or the extent is not an int64.
absl::StatusOr<int64_t> TensorByteExtent(int64_t rows, int64_t cols, int64_t row_stride,
                                         int64_t elem_size, const std::string& field);

// OK when [offset, offset + extent) lies within [0, size); else INVALID_ARGUMENT naming `field`
// and `what` (e.g. "buffer 'logits0' of 4096 bytes"). Never overflows.
absl::Status CheckSliceWithin(int64_t offset, int64_t extent, int64_t size,
                              const std::string& field, const std::string& what);

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_EXTENT_H_
