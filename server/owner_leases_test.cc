#include "server/owner_leases.h"

#include <gtest/gtest.h>

namespace samplerd {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(OwnerLeases, ExpireAfterTheLeaseWithoutCallsAndNotBefore) {
  OwnerLeases leases(absl::Seconds(5));
  leases.Track("a", kStart);
  leases.Track("b", kStart);
  leases.Touch("b", kStart + absl::Seconds(4));
  EXPECT_TRUE(leases.TakeExpired(kStart + absl::Seconds(5)).empty());
  EXPECT_EQ(leases.TakeExpired(kStart + absl::Seconds(5) + absl::Milliseconds(1)),
            std::vector<std::string>{"a"});
  EXPECT_FALSE(leases.Alive("a", kStart + absl::Seconds(6)));  // taken: no longer tracked
  EXPECT_TRUE(leases.Alive("b", kStart + absl::Seconds(6)));
  EXPECT_EQ(leases.TakeExpired(kStart + absl::Seconds(10)), std::vector<std::string>{"b"});
}

TEST(OwnerLeases, AnOpenStreamKeepsItsOwnerAlive) {
  OwnerLeases leases(absl::Seconds(1));
  leases.Track("a", kStart);
  leases.StreamOpened("a", kStart);
  EXPECT_TRUE(leases.TakeExpired(kStart + absl::Hours(1)).empty());
  EXPECT_TRUE(leases.Alive("a", kStart + absl::Hours(1)));
  // Closed by its client (not dropped): the lease runs from the close.
  EXPECT_FALSE(leases.StreamEnded("a", /*dropped=*/false, kStart + absl::Hours(1)));
  EXPECT_TRUE(leases.TakeExpired(kStart + absl::Hours(1) + absl::Milliseconds(500)).empty());
  EXPECT_EQ(leases.TakeExpired(kStart + absl::Hours(1) + absl::Seconds(2)),
            std::vector<std::string>{"a"});
}

TEST(OwnerLeases, ADroppedLastStreamEndsItsOwnerAtOnce) {
  OwnerLeases leases(absl::Seconds(5));
  leases.Track("a", kStart);
  leases.StreamOpened("a", kStart);
  leases.StreamOpened("a", kStart);
  EXPECT_FALSE(leases.StreamEnded("a", /*dropped=*/true, kStart));  // another stream is open
  EXPECT_TRUE(leases.StreamEnded("a", /*dropped=*/true, kStart));
  EXPECT_FALSE(leases.Alive("a", kStart));
  EXPECT_TRUE(leases.TakeExpired(kStart + absl::Hours(1)).empty());  // already gone
}

TEST(OwnerLeases, ClientsThatOwnNothingAreNotTracked) {
  OwnerLeases leases(absl::Seconds(5));
  leases.Touch("a", kStart);
  leases.StreamOpened("b", kStart);
  EXPECT_FALSE(leases.StreamEnded("b", /*dropped=*/true, kStart));  // nothing to release
  EXPECT_TRUE(leases.TakeExpired(kStart + absl::Hours(1)).empty());
  EXPECT_FALSE(leases.Alive("a", kStart));
}

TEST(OwnerLeases, ANonPositiveLeaseNeverExpires) {
  OwnerLeases leases(absl::ZeroDuration());
  leases.Track("a", kStart);
  EXPECT_TRUE(leases.TakeExpired(kStart + absl::Hours(1000)).empty());
  EXPECT_TRUE(leases.Alive("a", kStart + absl::Hours(1000)));
  leases.Forget("a");
  EXPECT_FALSE(leases.Alive("a", kStart));
}

}  // namespace
}  // namespace samplerd
