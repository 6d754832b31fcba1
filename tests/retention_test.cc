// coordinator/retention.h: which steps max_to_keep and keep_period delete,
// when a run follows a save, and the Retention that retires and removes them.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
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

// Orbax's BestN with EveryNSteps, as its preservation policies compute them
// (orbax/checkpoint/_src/checkpoint_managers/preservation_policy.py 0.12.8).
TEST(Retention, KeepsTheBestByAMetricAsOrbaxDoes) {
  const std::vector<int64_t> steps{1, 2, 3, 4, 5, 6};
  const std::vector<std::optional<double>> acc{0.5, 0.9, std::nullopt, 0.7, 0.9, 0.1};
  KeepBest max{"acc", true, true};
  // The best two: 0.9 at 2 and at 5; without a metric: 3, kept.
  EXPECT_EQ(BestStepsToDelete(steps, acc, 2, 0, max), (std::vector<int64_t>{1, 4, 6}));
  // Equal metrics: the later step is better (Python's stable sort).
  EXPECT_EQ(BestStepsToDelete(steps, acc, 1, 0, max), (std::vector<int64_t>{1, 2, 4, 6}));
  KeepBest min{"acc", false, false};
  // Lowest first; 3 goes, having no metric; the newest step 6 (0.1) stays,
  // and 4 is a multiple of keep_period.
  EXPECT_EQ(BestStepsToDelete(steps, acc, 2, 4, min), (std::vector<int64_t>{2, 3, 5}));
  // No more steps than max_to_keep, or 0: nothing goes, metric or not.
  EXPECT_EQ(BestStepsToDelete(steps, acc, 6, 0, min), std::vector<int64_t>{});
  EXPECT_EQ(BestStepsToDelete(steps, acc, 0, 0, min), std::vector<int64_t>{});
}

TEST(Retention, AMetricIsAWholeNumberInTheMetadata) {
  const UserMetadata m{{"loss", "0.25"},    {"int", "7"},   {"exp", "-1e-3"},
                       {"inf", "Infinity"}, {"nan", "NaN"}, {"text", "\"0.25\""},
                       {"tail", "0.25x"},   {"empty", ""}};
  EXPECT_EQ(MetricOf(m, "loss"), 0.25);
  EXPECT_EQ(MetricOf(m, "int"), 7.0);
  EXPECT_EQ(MetricOf(m, "exp"), -1e-3);
  EXPECT_EQ(MetricOf(m, "inf"), std::numeric_limits<double>::infinity());
  for (const char* none : {"nan", "text", "tail", "empty", "absent"}) {
    EXPECT_EQ(MetricOf(m, none), std::nullopt) << none;
  }
}

// A committed step in `store` (no arrays), created at `created_ms`.
void CommitStep(io::RootStore& store, int64_t step, UserMetadata metadata = {},
                int64_t created_ms = 0) {
  ASSERT_TRUE(store.CreateStep(step).ok());
  io::Marker m;
  m.step = step;
  m.created_unix_ms = created_ms;
  m.user_metadata = std::move(metadata);
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

TEST(Retention, ByAMetricReadFromEachStepsMarker) {
  auto store = io::MemoryRootStore::New("memory-root");
  ASSERT_TRUE(store->Create().ok());
  Retention r(store.get(), 2, 0, KeepBest{"loss", false, true});
  const char* loss[] = {"0.9", "0.3", "0.5", "0.4", "0.8"};
  for (int64_t step = 1; step <= 5; ++step) {
    CommitStep(*store, step, {{"loss", loss[step - 1]}});
    r.Run(step);
  }
  CommitStep(*store, 6);  // no metric: kept
  r.Run(6);
  EXPECT_EQ(store->CommittedSteps().value(), (std::vector<int64_t>{2, 4, 6}));
  // A step number that comes back is read again, not taken from before.
  ASSERT_TRUE(r.Retire(4).ok());
  CommitStep(*store, 4, {{"loss", "0.1"}});
  CommitStep(*store, 7, {{"loss", "0.2"}});
  r.Run(7);
  EXPECT_EQ(store->CommittedSteps().value(), (std::vector<int64_t>{4, 6, 7}));
  r.WaitForRemovals();
}

// Orbax's EveryNSeconds (preservation_policy.py 0.12.8): the first, then
// each one at least the interval after the last one kept.
TEST(Retention, KeepsByTimeAsOrbaxDoes) {
  const std::vector<int64_t> steps{1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> at{1000, 1500, 2999, 3000, 4000, 6000};
  EXPECT_EQ(StepsKeptByTime(steps, at, 2000), (std::vector<int64_t>{1, 4, 6}));
  EXPECT_EQ(StepsKeptByTime(steps, at, 1), steps);
  EXPECT_EQ(StepsKeptByTime(steps, at, 0), std::vector<int64_t>{});
  EXPECT_EQ(StepsKeptByTime({}, {}, 2000), std::vector<int64_t>{});
}

// max_to_keep 1 with an interval of 2 s: the newest, and the steps the
// interval keeps, by the creation times in their markers; with a metric too.
TEST(Retention, ByTimeReadFromEachStepsMarker) {
  auto store = io::MemoryRootStore::New("memory-root");
  ASSERT_TRUE(store->Create().ok());
  Retention r(store.get(), 1, 0, {}, 2000);
  const int64_t at[] = {1000, 1500, 2999, 3000, 4000, 6000};
  for (int64_t step = 1; step <= 6; ++step) {
    CommitStep(*store, step, {}, at[step - 1]);
    r.Run(step);
  }
  EXPECT_EQ(store->CommittedSteps().value(), (std::vector<int64_t>{1, 4, 6}));
  r.WaitForRemovals();

  auto best_store = io::MemoryRootStore::New("memory-root-2");
  ASSERT_TRUE(best_store->Create().ok());
  Retention best(best_store.get(), 1, 0, KeepBest{"loss", false, true}, 2000);
  const char* loss[] = {"0.9", "0.3", "0.5", "0.4", "0.8", "0.7"};
  for (int64_t step = 1; step <= 6; ++step) {
    CommitStep(*best_store, step, {{"loss", loss[step - 1]}}, at[step - 1]);
    best.Run(step);
  }
  // 2 (the best) and 1, 4, 6 by time.
  EXPECT_EQ(best_store->CommittedSteps().value(), (std::vector<int64_t>{1, 2, 4, 6}));
  best.WaitForRemovals();
}

TEST(Retention, RetireDeletesOneStepAndSaysWhenThereIsNone) {
  auto store = io::MemoryRootStore::New("memory-root");
  ASSERT_TRUE(store->Create().ok());
  Retention r(store.get(), 0, 0);
  CommitStep(*store, 1);
  CommitStep(*store, 2);
  ASSERT_TRUE(r.Retire(2).ok());
  EXPECT_EQ(store->CommittedSteps().value(), std::vector<int64_t>{1});
  EXPECT_EQ(r.Retire(2).code(), StatusCode::kNotFound);
  r.WaitForRemovals();
  EXPECT_TRUE(store->RetiredSteps().value().empty());
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
