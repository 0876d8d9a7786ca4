// The logits' element type: the one enum the core and the CUDA kernels share. Dependency-free,
// so nvcc compiles it into the kernels too; the API's DType (proto) maps to it once, in
// pipeline/proto_convert.
#ifndef SAMPLERD_SAMPLER_DTYPE_ENUM_H_
#define SAMPLERD_SAMPLER_DTYPE_ENUM_H_

#include <cstdint>

namespace samplerd {

enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

}  // namespace samplerd

#endif  // SAMPLERD_SAMPLER_DTYPE_ENUM_H_
