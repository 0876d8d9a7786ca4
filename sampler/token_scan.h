// Vectorised scans over token ids, for the penalties that read a request's whole context
// (SPEC 3 step 3's DRY): finding a token's positions and how far two runs of tokens agree.
// On x86-64 they use SSE2 (and AVX2 where the CPU has it, chosen at run time); elsewhere, plain
// loops. Every variant gives the same answer (token_scan_test checks each against the loop).
//
//   TokenPositions at;
//   FindToken(context.data(), context.size(), context.back(), at);
//   size_t run = CommonSuffix(context.data() + i + 1, context.data() + n, limit);
#ifndef SAMPLERD_SAMPLER_TOKEN_SCAN_H_
#define SAMPLERD_SAMPLER_TOKEN_SCAN_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/inlined_vector.h"

namespace samplerd {

// Positions of one token in a context (most contexts hold a few).
using TokenPositions = absl::InlinedVector<uint32_t, 32>;

// Appends every j < size with data[j] == token to `at`, in increasing order. size < 2^32.
void FindToken(const int32_t* data, size_t size, int32_t token, TokenPositions& at);

// The length of the longest common run of a[-1], a[-2], ... and b[-1], b[-2], ..., at most
// `limit` (both must be readable that far back).
size_t CommonSuffix(const int32_t* a, const int32_t* b, size_t limit);

namespace token_scan_internal {
// FindToken's variants, for the test: each is callable only where the CPU has it
// (HasAvx2()); FindToken uses the widest.
void FindTokenLoop(const int32_t* data, size_t size, int32_t token, TokenPositions& at);
void FindTokenSse2(const int32_t* data, size_t size, int32_t token, TokenPositions& at);
void FindTokenAvx2(const int32_t* data, size_t size, int32_t token, TokenPositions& at);
size_t CommonSuffixLoop(const int32_t* a, const int32_t* b, size_t limit);
bool HasSse2();
bool HasAvx2();
}  // namespace token_scan_internal

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_TOKEN_SCAN_H_
