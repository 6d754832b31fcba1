// coordinator/retention.h: which steps max_to_keep and keep_period delete,
// when a run follows a save, and the Retention that retires and removes them.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "base/fault.h"
#include "coordinator/retention.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/memory_root_store.h"
#include "io/step_index.h"

namespace mhckpt::internal {
namespace {

TEST(Retention, KeepsNewestAndPeriodSteps) {
  std::vector<int64_t> steps{0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(StepsToDelete(steps, 0, 0), std::vector<int64_t>{});
  EXPECT_EQ(StepsToDelete(steps, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(StepsToDelete(steps, 2, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(StepsToDelete({5}, 1, 0), std::vector<int64_t>{});
}

// A committed step in `store` (no arrays).
void CommitStep(io::RootStore& store, int64_t step) {
  ASSERT_TRUE(store.CreateStep(step).ok());
  io::Marker m;
  m.step = step;
  m.world_size = 1;
  m.chunk_bytes = io::kChunkBytes;
  m.index.bytes = io::kIndexHeaderBytes;
  ASSERT_TRUE(store.PutMarker(m, io::MarkerToJson(m)).ok());
}

TEST(Retention, FollowsASharedCommitOnlyOutsideDrainMode) {
  auto store = io::MemoryRootStore::New("memory-root");
  Retention r(store.get(), 2, 0);
  EXPECT_TRUE(r.FollowsSave(true, false, false));
  // The shared root committed, the local tier failed: retention all the same.
  EXPECT_TRUE(r.FollowsSave(false, true, false));
  EXPECT_FALSE(r.FollowsSave(false, false, false));
  // Drain mode: only the drain thread runs it, after the shared root's part.
  EXPECT_FALSE(r.FollowsSave(true, true, true));
  EXPECT_TRUE(r.FollowsDrain(true));
  EXPECT_FALSE(r.FollowsDrain(false));
  Retention off(store.get(), 0, 0);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.FollowsSave(true, true, false));
  EXPECT_FALSE(off.FollowsDrain(true));
}

TEST(Retention, RetiresWhatThePolicyDropsAndRemovesItInTheBackground) {
  auto store = io::MemoryRootStore::New("memory-root");
  ASSERT_TRUE(store->Create().ok());
  Retention r(store.get(), 2, 3);
  for (int64_t step = 1; step <= 6; ++step) {
    CommitStep(*store, step);
    EXPECT_GE(r.Run(step), 0.0);
  }
  // Kept: the newest two, and 3 (a multiple of keep_period).
  EXPECT_EQ(store->CommittedSteps().value(), (std::vector<int64_t>{3, 5, 6}));
  r.WaitForRemovals();
  EXPECT_TRUE(store->RetiredSteps().value().empty());
  EXPECT_TRUE(store->StepsWithoutMarker().value().empty());
}

TEST(Retention, AFailedRunIsLoggedNotThrown) {
  auto store = io::MemoryRootStore::New("memory-root");
  ASSERT_TRUE(store->Create().ok());
  Retention r(store.get(), 1, 0);
  CommitStep(*store, 1);
  CommitStep(*store, 2);
  ASSERT_TRUE(fault::Configure("point=retention,action=eio").ok());
  const double seconds = r.Run(2);
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_GE(seconds, 0.0);
  // Step 1 lost its marker (listed no more), not its directory yet.
  EXPECT_EQ(store->CommittedSteps().value(), std::vector<int64_t>{2});
}

}  // namespace
}  // namespace mhckpt::internal
