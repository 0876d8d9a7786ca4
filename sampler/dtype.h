// Conversion of bf16 / fp16 / fp32 logits to float32, exactly (every bf16 and fp16 value is a
// float32 value).
//
//   std::vector<float> row(view.cols);
//   LoadRowAsFloat(view, /*row=*/3, /*num_cols=*/vocab_size, row.data());
#ifndef SAMPLERD_SAMPLER_DTYPE_H_
#define SAMPLERD_SAMPLER_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "sampler/types.h"

namespace samplerd {

inline float BFloat16ToFloat(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &word, sizeof(out));
  return out;
}

// IEEE 754 binary16 to binary32, subnormals, infinities and NaN included.
inline float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  uint32_t word;
  if (exponent == 0x1F) {
    word = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {
    // Subnormal: normalise the mantissa.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    word = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float out;
  std::memcpy(&out, &word, sizeof(out));
  return out;
}

// Round-to-nearest-even float32 -> bf16 / fp16 (used by tests and clients to build inputs).
uint16_t FloatToBFloat16(float value);
uint16_t FloatToHalf(float value);

// Writes columns [first_col, first_col + num_cols) of `row` of `view` (host memory) as float32
// into `out`.
void LoadRowAsFloat(const LogitsView& view, int32_t row, int32_t first_col, int32_t num_cols,
                    float* out);
inline void LoadRowAsFloat(const LogitsView& view, int32_t row, int32_t num_cols, float* out) {
  LoadRowAsFloat(view, row, 0, num_cols, out);
}

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_DTYPE_H_
