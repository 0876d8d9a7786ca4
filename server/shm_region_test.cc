#include "server/shm_region.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// An shm object of `bytes` bytes filled with 0x5A, created (and unlinked at the end) by the test.
class ShmObject {
 public:
  explicit ShmObject(const std::string& what, size_t bytes)
      : name_("/samplerd-shm-test-" + std::to_string(getpid()) + "-" + what) {
    fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    std::vector<unsigned char> fill(bytes, 0x5A);
    EXPECT_EQ(pwrite(fd_, fill.data(), bytes, 0), static_cast<ssize_t>(bytes));
  }
  ~ShmObject() {
    close(fd_);
    shm_unlink(name_.c_str());
  }
  void Truncate(off_t bytes) { ASSERT_EQ(ftruncate(fd_, bytes), 0); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int fd_ = -1;
};

TEST(ShmRegion, ReadsInPlace) {
  ShmObject object("plain", 3 * 4096);
  auto region = ShmRegion::Open(object.name(), 3 * 4096, {});
  ASSERT_TRUE(region.ok()) << region.status();
  auto slice = (*region)->Slice(4096, 100, "logits.buffer");
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(static_cast<const unsigned char*>(*slice)[99], 0x5A);
  EXPECT_TRUE((*region)->Intact("logits.buffer", 4096 + 100).ok());
}

// The object shrinks after the step took its slice, while the step reads it: the read sees
// zeros instead of raising SIGBUS, and Intact fails the step. Without the handler this test
// dies of SIGBUS.
TEST(ShmRegion, TruncatedDuringTheReadFailsTheStepNotTheProcess) {
  constexpr size_t kBytes = 8 * 4096;
  ShmObject object("shrink", kBytes);
  auto region = ShmRegion::Open(object.name(), kBytes, {});
  ASSERT_TRUE(region.ok()) << region.status();
  auto slice = (*region)->Slice(0, kBytes, "logits.buffer");
  ASSERT_TRUE(slice.ok());
  const volatile unsigned char* bytes = static_cast<const unsigned char*>(*slice);
  EXPECT_EQ(bytes[5 * 4096], 0x5A);
  object.Truncate(2 * 4096);
  EXPECT_EQ(bytes[100], 0x5A);       // still in the object
  EXPECT_EQ(bytes[5 * 4096], 0x00);  // gone: a zero page, not SIGBUS
  EXPECT_EQ(bytes[kBytes - 1], 0x00);
  const absl::Status intact = (*region)->Intact("logits.buffer", kBytes);
  EXPECT_EQ(intact.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(intact.message()), HasSubstr("logits.buffer: shared-memory object"));
  EXPECT_THAT(std::string(intact.message()), HasSubstr("shrank to 8192 bytes"));
  // Every later step on the region is refused before it reads.
  EXPECT_EQ((*region)->Slice(0, 16, "x").status().code(), absl::StatusCode::kFailedPrecondition);
}

// A shrink found before any read: the step is refused at once.
TEST(ShmRegion, TruncatedBeforeTheReadIsRefused) {
  ShmObject object("before", 4 * 4096);
  auto region = ShmRegion::Open(object.name(), 4 * 4096, {});
  ASSERT_TRUE(region.ok());
  object.Truncate(4096);
  EXPECT_TRUE((*region)->Slice(0, 4096, "f").ok());  // the slice still lies in the object
  auto slice = (*region)->Slice(0, 2 * 4096, "f");
  EXPECT_EQ(slice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(slice.status().message()), HasSubstr("shrank to 4096 bytes"));
}

// A shrink during a read that cannot fault (the CUDA backend's DMA from the pinned mapping
// reads the old pages): no SIGBUS marks the region, so Intact's size check fails the step; a
// read that ended inside what is left stays good.
TEST(ShmRegion, ShrinkWithoutAFaultFailsTheStepThatReadPastTheNewEnd) {
  ShmObject object("dma", 4 * 4096);
  auto region = ShmRegion::Open(object.name(), 4 * 4096, {});
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE((*region)->Slice(0, 4 * 4096, "logits.buffer").ok());
  object.Truncate(2 * 4096);
  const absl::Status intact = (*region)->Intact("logits.buffer", 4 * 4096);
  EXPECT_EQ(intact.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(intact.message()), HasSubstr("shrank to 8192 bytes"));
  EXPECT_TRUE((*region)->Intact("logits.buffer", 2 * 4096).ok());
}

// Other regions are untouched by one region's fault; closed regions free their slot.
TEST(ShmRegion, FaultsStayWithTheirRegion) {
  ShmObject a("a", 4 * 4096), b("b", 4 * 4096);
  auto ra = ShmRegion::Open(a.name(), 4 * 4096, {});
  auto rb = ShmRegion::Open(b.name(), 4 * 4096, {});
  ASSERT_TRUE(ra.ok() && rb.ok());
  const volatile unsigned char* pa = static_cast<const unsigned char*>(*(*ra)->Slice(0, 4 * 4096, "a"));
  a.Truncate(0);
  EXPECT_EQ(pa[3 * 4096], 0);
  EXPECT_FALSE((*ra)->Intact("a", 4 * 4096).ok());
  EXPECT_TRUE((*rb)->Intact("b", 4 * 4096).ok());
  for (int i = 0; i < 2 * ShmRegion::kMaxMappings / 1000; ++i) {  // slots are reused
    ShmObject c("c" + std::to_string(i), 4096);
    EXPECT_TRUE(ShmRegion::Open(c.name(), 4096, {}).ok());
  }
}

}  // namespace
}  // namespace samplerd
