#include "sampler/types.h"

#include "sampler/extent.h"

namespace samplerd {

int DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
  }
  return 4;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "FLOAT32";
    case DType::kBFloat16:
      return "BFLOAT16";
    case DType::kFloat16:
      return "FLOAT16";
  }
  return "?";
}

const char* StepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kPrefill:
      return "PREFILL";
    case StepKind::kDecode:
      return "DECODE";
    case StepKind::kDraft:
      return "DRAFT";
  }
  return "?";
}

int64_t LogitsView::ByteExtent() const {
  if (rows <= 0 || cols <= 0) return 0;
  auto extent = TensorByteExtent(rows, cols, row_stride, DTypeSize(dtype), "view");
  return extent.ok() ? *extent : -1;
}

}  // namespace samplerd
