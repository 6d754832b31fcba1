// coordinator/drain_queue.h: each part's deadline counts from its own start,
// a retention after a part has one of its own, and abandoning a part
// abandons the parts queued behind it.
#include <gtest/gtest.h>

#include <chrono>

#include "coordinator/drain_queue.h"

namespace mhckpt::internal {
namespace {

using Clock = DrainQueue::Clock;
using std::chrono::seconds;

TEST(DrainQueue, NoDeadlineWhileIdle) {
  DrainQueue q(10);
  EXPECT_FALSE(q.Due(false).has_value());
  EXPECT_FALSE(q.Late(false, Clock::now() + seconds(100)));
  EXPECT_EQ(q.FirstUnabandoned(), -1);
  q.HandOff(3);  // queued, not started: nothing runs yet
  EXPECT_FALSE(q.Due(false).has_value());
  EXPECT_EQ(q.FirstUnabandoned(), 3);
}

TEST(DrainQueue, EachPartHasTheDeadlineFromItsOwnStart) {
  DrainQueue q(10);
  const Clock::time_point t0 = Clock::now();
  q.HandOff(1);
  q.HandOff(2);
  q.Started(1, t0);
  EXPECT_TRUE(q.PartRunning());
  EXPECT_EQ(*q.Due(false), t0 + seconds(10));
  EXPECT_FALSE(q.Late(false, t0 + seconds(9)));
  EXPECT_TRUE(q.Late(false, t0 + seconds(10)));
  // Step 2 waited behind step 1 for 8 s: its 10 s start when it starts.
  EXPECT_FALSE(q.Ended(1, false, t0 + seconds(8)));
  EXPECT_FALSE(q.PartRunning());
  EXPECT_FALSE(q.Due(false).has_value());
  EXPECT_EQ(q.FirstUnabandoned(), 2);
  q.Started(2, t0 + seconds(8));
  EXPECT_FALSE(q.Late(false, t0 + seconds(17)));
  EXPECT_TRUE(q.Late(false, t0 + seconds(18)));
  q.Ended(2, false, t0 + seconds(20));
  EXPECT_EQ(q.FirstUnabandoned(), -1);
}

TEST(DrainQueue, TheRetentionAfterAPartHasItsOwnDeadline) {
  DrainQueue q(5);
  const Clock::time_point t0 = Clock::now();
  q.HandOff(1);
  q.Started(1, t0);
  q.Ended(1, /*retention_follows=*/true, t0 + seconds(4));
  EXPECT_FALSE(q.PartRunning());
  ASSERT_TRUE(q.Due(true).has_value());
  EXPECT_EQ(*q.Due(true), t0 + seconds(9));
  EXPECT_FALSE(q.Late(true, t0 + seconds(8)));
  EXPECT_TRUE(q.Late(true, t0 + seconds(9)));
  // A late retention abandons no part: none is queued.
  EXPECT_EQ(q.FirstUnabandoned(), -1);
  EXPECT_FALSE(q.Due(false).has_value());  // the retention ended
}

TEST(DrainQueue, AbandoningAPartAbandonsThoseQueuedBehindIt) {
  DrainQueue q(1);
  const Clock::time_point t0 = Clock::now();
  for (int64_t step : {4, 5, 6}) q.HandOff(step);
  q.Started(4, t0);
  ASSERT_TRUE(q.Late(false, t0 + seconds(2)));
  EXPECT_EQ(q.FirstUnabandoned(), 4);
  Status s = q.Abandon(4, 1);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("step 4"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("on rank 1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("5,6"), std::string::npos) << s.ToString();
  EXPECT_TRUE(q.IsAbandoned(4));
  EXPECT_TRUE(q.IsAbandoned(5));
  EXPECT_TRUE(q.IsAbandoned(6));
  EXPECT_EQ(q.FirstUnabandoned(), -1);
  // Only the first time is reported.
  EXPECT_TRUE(q.Abandon(4, 0).ok());
  // A part handed off later is not abandoned with them.
  q.HandOff(7);
  EXPECT_FALSE(q.IsAbandoned(7));
  EXPECT_EQ(q.FirstUnabandoned(), 7);
  // The abandoned part that ends says so.
  EXPECT_TRUE(q.Ended(4, false, t0 + seconds(3)));
  EXPECT_FALSE(q.Ended(7, false, t0 + seconds(3)));
}

}  // namespace
}  // namespace mhckpt::internal
