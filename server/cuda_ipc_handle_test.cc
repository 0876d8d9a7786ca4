#include "server/cuda_ipc_handle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace samplerd {
namespace {

using ::testing::HasSubstr;

std::string Raw() {
  std::string raw(64, '\0');
  for (int i = 0; i < 64; ++i) raw[i] = static_cast<char>(i * 3 + 1);
  return raw;
}

TEST(ParseCudaIpcHandle, AcceptsARawHandle) {
  auto handle = ParseCudaIpcHandle(Raw(), "h");
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(std::string(handle->data(), 64), Raw());
}

TEST(ParseCudaIpcHandle, AcceptsPyTorchShareCudaForm) {
  auto handle = ParseCudaIpcHandle(std::string("\x02") + "c" + Raw(), "h");
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(std::string(handle->data(), 64), Raw());
}

TEST(ParseCudaIpcHandle, RefusesExpandableSegmentsWithAdvice) {
  auto handle = ParseCudaIpcHandle(std::string("\x02") + "e" + Raw(), "cuda_ipc_handle");
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(handle.status().message()), HasSubstr("cuda_ipc_handle"));
  EXPECT_THAT(std::string(handle.status().message()), HasSubstr("expandable_segments:False"));
}

TEST(ParseCudaIpcHandle, RefusesOtherVersionsTypesAndLengths) {
  EXPECT_THAT(std::string(ParseCudaIpcHandle(std::string("\x01") + "c" + Raw(), "h").status().message()),
              HasSubstr("version byte 2"));
  EXPECT_THAT(std::string(ParseCudaIpcHandle(std::string("\x02") + "x" + Raw(), "h").status().message()),
              HasSubstr("unknown PyTorch handle type"));
  for (size_t n : {0, 1, 63, 65, 67, 128}) {
    auto handle = ParseCudaIpcHandle(std::string(n, 'a'), "logits.cuda_ipc.handle");
    EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(std::string(handle.status().message()), HasSubstr("logits.cuda_ipc.handle: "));
  }
}

}  // namespace
}  // namespace samplerd
