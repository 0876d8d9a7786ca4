#include "server/connection_ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

namespace samplerd {
namespace {

using ::testing::HasSubstr;

// A connected socket pair standing in for an accepted connection (the ledger sees its first
// descriptor); closing both is the connection ending.
struct Pair {
  int fd[2] = {-1, -1};
  Pair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~Pair() { Close(); }
  void Close() {
    for (int& f : fd) {
      if (f >= 0) close(f);
      f = -1;
    }
  }
};

TEST(ConnectionLedger, RefusesPastEachUidsLimitThenAdmitsOnceOneCloses) {
  ConnectionLedger ledger({.max_total = 10, .max_per_uid = 3});
  std::vector<std::unique_ptr<Pair>> mine;
  for (int i = 0; i < 3; ++i) {
    mine.push_back(std::make_unique<Pair>());
    ASSERT_TRUE(ledger.Admit(mine.back()->fd[0], 1000).ok()) << i;
  }
  Pair fourth;
  const absl::Status refused = ledger.Admit(fourth.fd[0], 1000);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("uid 1000 hold 3"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--max_connections_per_uid"));
  // Another user is not held back by uid 1000's connections; unknown uids count as one user.
  Pair other, unknown;
  EXPECT_TRUE(ledger.Admit(other.fd[0], 1001).ok());
  EXPECT_TRUE(ledger.Admit(unknown.fd[0], std::nullopt).ok());
  EXPECT_EQ(ledger.refused(), 1);
  // One of uid 1000's connections ends: the next is admitted (the sweep finds it closed).
  mine[0]->Close();
  EXPECT_TRUE(ledger.Admit(fourth.fd[0], 1000).ok());
  EXPECT_EQ(ledger.Sweep(), 5);
}

TEST(ConnectionLedger, RefusesPastTheTotalWhateverTheUid) {
  ConnectionLedger ledger({.max_total = 4, .max_per_uid = 100});
  std::vector<std::unique_ptr<Pair>> open;
  for (int i = 0; i < 4; ++i) {
    open.push_back(std::make_unique<Pair>());
    ASSERT_TRUE(ledger.Admit(open.back()->fd[0], 2000 + i).ok()) << i;
  }
  Pair fifth;
  const absl::Status refused = ledger.Admit(fifth.fd[0], 3000);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--max_connections)"));
  open.clear();
  EXPECT_EQ(ledger.Sweep(), 0);
  EXPECT_TRUE(ledger.Admit(fifth.fd[0], 3000).ok());
}

// A descriptor number gRPC closed and the kernel gave to a new connection (or to any other
// file) is not the old connection: the sweep compares the socket it names, not the number.
TEST(ConnectionLedger, AReusedDescriptorNumberIsANewConnection) {
  ConnectionLedger ledger({.max_total = 2, .max_per_uid = 1});
  auto first = std::make_unique<Pair>();
  const int number = first->fd[0];
  ASSERT_TRUE(ledger.Admit(number, 7).ok());
  first->Close();
  // The same number, now another socket (of another user): counted once, not twice.
  Pair second;
  ASSERT_EQ(dup2(second.fd[0], number), number);
  EXPECT_TRUE(ledger.Admit(number, 8).ok());
  EXPECT_EQ(ledger.Sweep(), 1);
  // The number now names another file altogether: the sweep forgets it.
  Pair third;
  ASSERT_EQ(dup2(third.fd[1], number), number);
  EXPECT_EQ(ledger.Sweep(), 0);
  close(number);
}

TEST(ConnectionLedger, AClosedDescriptorIsAnInternalError) {
  ConnectionLedger ledger({});
  EXPECT_EQ(ledger.Admit(-1, 0).code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace samplerd
