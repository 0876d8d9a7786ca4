#include "sampler/dtype.h"

#include <cmath>

namespace samplerd {

uint16_t FloatToBFloat16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if (std::isnan(value)) return static_cast<uint16_t>((word >> 16) | 0x40u);
  const uint32_t rounding = 0x7FFFu + ((word >> 16) & 1u);
  return static_cast<uint16_t>((word + rounding) >> 16);
}

uint16_t FloatToHalf(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const uint32_t abs = word & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u);
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to infinity
  if (abs < 0x38800000u) {
    // Subnormal or zero in fp16: round abs / 2^-24 to nearest even.
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof(magnitude));
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  const uint32_t rounding = 0xFFFu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((abs - 0x38000000u + rounding) >> 13);
}

void LoadRowAsFloat(const LogitsView& view, int32_t row, int32_t first_col, int32_t num_cols,
                    float* out) {
  const void* src = static_cast<const char*>(view.Row(row)) +
                    static_cast<int64_t>(first_col) * DTypeSize(view.dtype);
  switch (view.dtype) {
    case DType::kFloat32:
      std::memcpy(out, src, static_cast<size_t>(num_cols) * sizeof(float));
      return;
    // Byte-wise loads: a shm slice or an inline buffer need not be 2-byte aligned.
    case DType::kBFloat16: {
      const unsigned char* bytes = static_cast<const unsigned char*>(src);
      for (int32_t c = 0; c < num_cols; ++c) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * static_cast<size_t>(c), sizeof(bits));
        out[c] = BFloat16ToFloat(bits);
      }
      return;
    }
    case DType::kFloat16: {
      const unsigned char* bytes = static_cast<const unsigned char*>(src);
      for (int32_t c = 0; c < num_cols; ++c) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * static_cast<size_t>(c), sizeof(bits));
        out[c] = HalfToFloat(bits);
      }
      return;
    }
  }
}

}  // namespace samplerd
