#include "sampler/token_scan.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define SAMPLERD_X86_SCAN 1
#include <immintrin.h>
#endif

namespace samplerd {
namespace token_scan_internal {

void FindTokenLoop(const int32_t* data, size_t size, int32_t token, TokenPositions& at) {
  for (size_t j = 0; j < size; ++j) {
    if (data[j] == token) at.push_back(static_cast<uint32_t>(j));
  }
}

size_t CommonSuffixLoop(const int32_t* a, const int32_t* b, size_t limit) {
  size_t r = 0;
  while (r < limit && a[-1 - static_cast<ptrdiff_t>(r)] == b[-1 - static_cast<ptrdiff_t>(r)]) ++r;
  return r;
}

// The loop over what a vector block left at the end, its positions offset by `b`.
static void FindTokenTail(const int32_t* data, size_t b, size_t size, int32_t token,
                          TokenPositions& at) {
  const size_t before = at.size();
  FindTokenLoop(data + b, size - b, token, at);
  for (size_t k = before; k < at.size(); ++k) at[k] += static_cast<uint32_t>(b);
}

// Written with intrinsics and chosen by a run-time check rather than row_kernels.cc's
// target_clones: the compiler's own vectorisation of the block test spilled its compares to
// the stack and could not make the bit mask (2.6x slower a 4,096-token row).
#if SAMPLERD_X86_SCAN
bool HasSse2() { return true; }  // part of x86-64
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// Almost every block of a long context holds no match: 16 tokens (32 with AVX2) are tested at a
// time without a branch, and a bit mask is made only for a block that holds one.
void FindTokenSse2(const int32_t* data, size_t size, int32_t token, TokenPositions& at) {
  const __m128i v = _mm_set1_epi32(token);
  size_t b = 0;
  for (; b + 16 <= size; b += 16) {
    const __m128i* p = reinterpret_cast<const __m128i*>(data + b);
    const __m128i e0 = _mm_cmpeq_epi32(_mm_loadu_si128(p), v);
    const __m128i e1 = _mm_cmpeq_epi32(_mm_loadu_si128(p + 1), v);
    const __m128i e2 = _mm_cmpeq_epi32(_mm_loadu_si128(p + 2), v);
    const __m128i e3 = _mm_cmpeq_epi32(_mm_loadu_si128(p + 3), v);
    const __m128i any = _mm_or_si128(_mm_or_si128(e0, e1), _mm_or_si128(e2, e3));
    if (_mm_movemask_epi8(any) == 0) continue;
    uint32_t mask = static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(e0))) |
                    static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(e1))) << 4 |
                    static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(e2))) << 8 |
                    static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(e3))) << 12;
    for (; mask != 0; mask &= mask - 1) {
      at.push_back(static_cast<uint32_t>(b) + static_cast<uint32_t>(__builtin_ctz(mask)));
    }
  }
  FindTokenTail(data, b, size, token, at);
}

__attribute__((target("avx2"))) void FindTokenAvx2(const int32_t* data, size_t size,
                                                   int32_t token, TokenPositions& at) {
  const __m256i v = _mm256_set1_epi32(token);
  size_t b = 0;
  for (; b + 32 <= size; b += 32) {
    const __m256i* p = reinterpret_cast<const __m256i*>(data + b);
    const __m256i e0 = _mm256_cmpeq_epi32(_mm256_loadu_si256(p), v);
    const __m256i e1 = _mm256_cmpeq_epi32(_mm256_loadu_si256(p + 1), v);
    const __m256i e2 = _mm256_cmpeq_epi32(_mm256_loadu_si256(p + 2), v);
    const __m256i e3 = _mm256_cmpeq_epi32(_mm256_loadu_si256(p + 3), v);
    const __m256i any = _mm256_or_si256(_mm256_or_si256(e0, e1), _mm256_or_si256(e2, e3));
    if (_mm256_testz_si256(any, any)) continue;
    uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(e0))) |
                    static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(e1))) << 8 |
                    static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(e2))) << 16 |
                    static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(e3))) << 24;
    for (; mask != 0; mask &= mask - 1) {
      at.push_back(static_cast<uint32_t>(b) + static_cast<uint32_t>(__builtin_ctz(mask)));
    }
  }
  FindTokenTail(data, b, size, token, at);
}
#else
bool HasSse2() { return false; }
bool HasAvx2() { return false; }
void FindTokenSse2(const int32_t* data, size_t size, int32_t token, TokenPositions& at) {
  FindTokenLoop(data, size, token, at);
}
void FindTokenAvx2(const int32_t* data, size_t size, int32_t token, TokenPositions& at) {
  FindTokenLoop(data, size, token, at);
}
#endif

}  // namespace token_scan_internal

void FindToken(const int32_t* data, size_t size, int32_t token, TokenPositions& at) {
  using namespace token_scan_internal;
  if (HasAvx2()) {
    FindTokenAvx2(data, size, token, at);
  } else if (HasSse2()) {
    FindTokenSse2(data, size, token, at);
  } else {
    FindTokenLoop(data, size, token, at);
  }
}

size_t CommonSuffix(const int32_t* a, const int32_t* b, size_t limit) {
  size_t r = 0;
#if SAMPLERD_X86_SCAN
  for (; r + 4 <= limit; r += 4) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a - r - 4));
    const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b - r - 4));
    // Bit 3 is a[-1 - r], bit 0 is a[-4 - r]: the run ends below the highest differing bit.
    const int differ = ~_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(x, y))) & 0xF;
    if (differ != 0) return r + static_cast<size_t>(__builtin_clz(differ) - 28);
  }
#endif
  return r + token_scan_internal::CommonSuffixLoop(a - r, b - r, limit - r);
}

}  // namespace samplerd
