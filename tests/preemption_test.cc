// Preemption notices and the per-step agreement (ReachedPreemption,
// ShouldSave): a notice on one rank, from NotifyPreemption or a real signal,
// turns true on every rank at the same step; mismatched steps are the same
// error on every rank; the save policy's answer is the same on every rank;
// the preemption step's save records the notice in its commit marker; the
// signal handlers in place before Open come back when the manager goes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

using Clock = std::chrono::steady_clock;

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t MinOverRanks(int64_t v) {
  int64_t out = v;
  MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  return out;
}
int64_t MaxOverRanks(int64_t v) {
  int64_t out = v;
  MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// One small row-sharded array per rank.
struct State {
  explicit State(uint64_t seed) {
    const std::vector<int64_t> shape{16 * static_cast<int64_t>(Size()), 8};
    const Box box{{16 * static_cast<int64_t>(Rank()), 0}, {16, 8}};
    bytes = Fill(DType::kFloat32, shape, box, seed);
    arrays = {{"w", DType::kFloat32, shape, {Shard{box, bytes.data()}}}};
  }
  std::vector<std::byte> bytes;
  std::vector<ArrayToSave> arrays;
};

class Preemption : public ::testing::Test {
 protected:
  // Notices are process-wide: each test starts without one.
  void SetUp() override { ClearPreemptionNotice(); }
  void TearDown() override {
    ClearPreemptionNotice();
    fault::Configure("").IgnoreError();
  }
};

// Calls ReachedPreemption for steps first.. until it is true (at most
// `limit` steps), calling `before(step)` first at each step; returns the
// step at which it was true (-1 if never), failing the test on an error.
int64_t FirstPreemptedStep(CheckpointManager& m, int64_t first, int64_t limit,
                           const std::function<void(int64_t)>& before) {
  for (int64_t step = first; step < first + limit; ++step) {
    before(step);
    Result<bool> r = m.ReachedPreemption(step);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return -1;
    if (*r) return step;
  }
  return -1;
}

TEST_F(Preemption, ANoticeOnOneRankIsTrueOnEveryRankAtTheSameStep) {
  for (int k = 0; k < Size(); ++k) {
    // A fresh agreement per notice: the previous one has latched its step.
    auto fresh = OpenForTest(FreshDir(fmt::format("k{}", k)));
    ASSERT_TRUE(fresh);
    ClearPreemptionNotice();
    // Noticed at step 3 before its round: that round carries it, and step 4
    // decides from it.
    const int64_t at = FirstPreemptedStep(*fresh, 0, 20, [&](int64_t step) {
      if (step == 3 && Rank() == k) NotifyPreemption();
    });
    EXPECT_EQ(at, 4) << "notice on rank " << k;
    EXPECT_EQ(MinOverRanks(at), MaxOverRanks(at));
    // Every later step stays true; the same step asked again answers alike.
    for (int64_t step = at; step < at + 3; ++step) {
      Result<bool> again = fresh->ReachedPreemption(step);
      ASSERT_TRUE(again.ok());
      EXPECT_TRUE(*again) << step;
    }
  }
}

// A notice that arrives after a step's call is acted on two steps later.
TEST_F(Preemption, ANoticeAfterAStepsCallIsActedOnTwoStepsLater) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  int64_t at = -1;
  for (int64_t step = 0; step < 20 && at < 0; ++step) {
    Result<bool> r = m->ReachedPreemption(step);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (*r) at = step;
    if (step == 3 && Rank() == Size() - 1) NotifyPreemption();
  }
  EXPECT_EQ(at, 5);
  EXPECT_EQ(MinOverRanks(at), MaxOverRanks(at));
}

TEST_F(Preemption, ARealSignalOnOneRankIsTrueOnEveryRankAtTheSameStep) {
  Options o;
  o.preemption.enabled = true;
  auto m = OpenForTest(FreshDir(), o);
  ASSERT_TRUE(m);
  const int k = Size() - 1;
  const int64_t at = FirstPreemptedStep(*m, 10, 20, [&](int64_t step) {
    if (step == 12 && Rank() == k) ASSERT_EQ(raise(SIGUSR1), 0);
  });
  EXPECT_EQ(at, 13);
  EXPECT_EQ(MinOverRanks(at), MaxOverRanks(at));
}

TEST_F(Preemption, WithoutANoticeItIsFalseAndCheap) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  // Back to back: each call completes a round posted microseconds before.
  std::vector<double> tight, spaced, second;
  for (int64_t step = 0; step < 100; ++step) {
    auto t0 = Clock::now();
    Result<bool> r = m->ReachedPreemption(step);
    tight.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(*r) << step;
  }
  // With a millisecond of "training" between steps, and the second call of
  // a step (ShouldSave after ReachedPreemption), which reuses the decision.
  for (int64_t step = 100; step < 200; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto t0 = Clock::now();
    Result<bool> r = m->ReachedPreemption(step);
    auto t1 = Clock::now();
    Result<bool> s = m->ShouldSave(step);
    auto t2 = Clock::now();
    spaced.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    second.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    ASSERT_TRUE(r.ok() && s.ok());
    EXPECT_FALSE(*r) << step;
    EXPECT_FALSE(*s) << step;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto max = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  if (Rank() == 0) {
    std::printf(
        "ReachedPreemption per call at %d ranks: back to back median %.1f us (max %.1f); with 1 "
        "ms between steps median %.1f us (max %.1f); the second call of a step median %.2f us\n",
        Size(), median(tight), max(tight), median(spaced), max(spaced), median(second));
  }
}

TEST_F(Preemption, MismatchedStepsAreTheSameErrorOnEveryRank) {
  if (Size() < 2) GTEST_SKIP() << "needs two ranks";
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->ReachedPreemption(6).ok());
  // Decided from step 6's round: no error yet.
  ASSERT_TRUE(m->ReachedPreemption(Rank() == 0 ? 7 : 9).ok());
  Result<bool> r = m->ShouldSave(10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      r.status().message().find("ranks called ReachedPreemption with different steps: 7 .. 9"),
      std::string::npos)
      << r.status().ToString();
  EXPECT_TRUE(SameOnAllRanks(r.status()));
  // The same step again: the same error; the next step is fine again.
  EXPECT_EQ(m->ReachedPreemption(10).status(), r.status());
  EXPECT_TRUE(m->ReachedPreemption(11).ok());
}

TEST_F(Preemption, ShouldSaveEveryIntervalSteps) {
  Options o;
  o.save_interval_steps = 3;
  auto m = OpenForTest(FreshDir(), o);
  ASSERT_TRUE(m);
  for (int64_t step = 0; step < 11; ++step) {
    Result<bool> r = m->ShouldSave(step);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, step % 3 == 0) << step;
  }
}

TEST_F(Preemption, DifferentSavePoliciesFailOpen) {
  Options o;
  o.save_interval_steps = Rank() == 0 ? 5 : 4;
  if (Size() < 2) GTEST_SKIP() << "needs two ranks";
  auto m = CheckpointManager::Open(MPI_COMM_WORLD, FreshDir(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("save_interval_steps"), std::string::npos);
}

// Continuous: false while a save is held on the last rank, on every rank;
// true again once it has finished everywhere.
TEST_F(Preemption, ShouldSaveContinuouslyWhenThePreviousSaveHasFinishedEverywhere) {
  Options o;
  o.save_continuously = true;
  const std::string dir = FreshDir();
  auto m = OpenForTest(dir, o);
  ASSERT_TRUE(m);
  if (!m->async()) GTEST_SKIP() << "needs MPI_THREAD_MULTIPLE";
  const std::string gate = fmt::format("{}/gate", dir);
  ASSERT_TRUE(
      fault::Configure(fmt::format("rank={},point=plan,action=wait,file={}", Size() - 1, gate))
          .ok());
  Result<bool> first = m->ShouldSave(0);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);  // nothing saved yet
  State s0(1);
  ASSERT_TRUE(m->Save(0, s0.arrays).ok());
  for (int64_t step = 1; step <= 5; ++step) {
    Result<bool> r = m->ShouldSave(step);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(*r) << "step " << step << " while step 0's save is held";
  }
  if (Rank() == Size() - 1) {
    FILE* f = std::fopen(gate.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  // Step 5's round saw the save in flight; step 6's, posted after it ended,
  // sees it finished on every rank.
  Result<bool> r6 = m->ShouldSave(6);
  Result<bool> r7 = m->ShouldSave(7);
  ASSERT_TRUE(r6.ok() && r7.ok());
  EXPECT_FALSE(*r6);
  EXPECT_TRUE(*r7);
  EXPECT_EQ(MinOverRanks(*r7 ? 1 : 0), 1);
}

TEST_F(Preemption, ShouldSaveContinuouslyKeepsTheMinimumInterval) {
  Options o;
  o.save_continuously = true;
  o.min_save_interval_seconds = 3600;
  auto m = OpenForTest(FreshDir(), o);
  ASSERT_TRUE(m);
  ASSERT_TRUE(*m->ShouldSave(0));
  State s0(1);
  ASSERT_TRUE(m->Save(0, s0.arrays).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  for (int64_t step = 1; step < 6; ++step) EXPECT_FALSE(*m->ShouldSave(step)) << step;
}

TEST_F(Preemption, ThePreemptionSaveRecordsTheNoticeInItsMarker) {
  Options o;
  o.preemption.grace_seconds = 90;
  o.save_interval_steps = 100;
  const std::string dir = FreshDir();
  auto m = OpenForTest(dir, o);
  ASSERT_TRUE(m);
  const int k = Size() - 1;
  int64_t noticed = 0;
  int64_t saved_step = -1;
  for (int64_t step = 0; step < 20 && saved_step < 0; ++step) {
    if (step == 2 && Rank() == k) {
      noticed = NowUnixMs();
      NotifyPreemption();
    }
    Result<bool> save = m->ShouldSave(step);
    Result<bool> preempted = m->ReachedPreemption(step);
    ASSERT_TRUE(save.ok() && preempted.ok());
    EXPECT_EQ(*save, step == 0 || *preempted) << step;
    if (*save) {
      State s(static_cast<uint64_t>(step));
      ASSERT_TRUE(m->Save(step, s.arrays).ok());
      ASSERT_TRUE(m->WaitUntilFinished().ok());
    }
    if (*preempted) saved_step = step;
  }
  ASSERT_EQ(saved_step, 3);
  noticed = MaxOverRanks(noticed);
  // After the preemption step: still preempted, no longer a step to save.
  EXPECT_TRUE(*m->ReachedPreemption(4));
  EXPECT_FALSE(*m->ShouldSave(4));
  Result<StepDescription> d = m->Describe(saved_step);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(d->preemption.has_value());
  EXPECT_GE(d->preemption->notice_unix_ms, noticed - 1);
  EXPECT_LE(d->preemption->notice_unix_ms, noticed + 1000);
  EXPECT_EQ(d->preemption->grace_seconds, 90);
  EXPECT_GE(d->preemption->saved_after_seconds, 0);
  EXPECT_LT(d->preemption->saved_after_seconds, 60);
  EXPECT_EQ(d->preemption->saved_after_seconds,
            static_cast<double>(d->created_unix_ms - d->preemption->notice_unix_ms) / 1000);
  // Other steps have no record.
  Result<StepDescription> d0 = m->Describe(0);
  ASSERT_TRUE(d0.ok());
  EXPECT_FALSE(d0->preemption.has_value());
}

// The handler of a signal before Open: a function of the test's own.
void TestHandler(int /*signal*/) {}

void (*CurrentHandler(int sig))(int) {
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  return now.sa_handler;
}

TEST_F(Preemption, HandlersAreRestoredWhenTheLastManagerCloses) {
  struct sigaction mine {
  }, before_term{};
  mine.sa_handler = TestHandler;
  sigemptyset(&mine.sa_mask);
  struct sigaction before_usr1 {};
  ASSERT_EQ(sigaction(SIGUSR1, &mine, &before_usr1), 0);
  sigaction(SIGTERM, nullptr, &before_term);
  Options o;
  o.preemption.enabled = true;
  {
    auto a = OpenForTest(FreshDir("a"), o);
    ASSERT_TRUE(a);
    auto installed = CurrentHandler(SIGUSR1);
    EXPECT_NE(installed, TestHandler);
    EXPECT_EQ(CurrentHandler(SIGTERM), installed);
    {
      Options usr1_only = o;
      usr1_only.preemption.signals = {SIGUSR1};
      auto b = OpenForTest(FreshDir("b"), usr1_only);
      ASSERT_TRUE(b);
      EXPECT_EQ(CurrentHandler(SIGUSR1), installed);
    }
    // `a` still holds both.
    EXPECT_EQ(CurrentHandler(SIGUSR1), installed);
    EXPECT_EQ(CurrentHandler(SIGTERM), installed);
    // A signal now is a notice, not the test's handler nor an exit.
    ASSERT_EQ(raise(SIGUSR1), 0);
  }
  EXPECT_EQ(CurrentHandler(SIGUSR1), TestHandler);
  EXPECT_EQ(CurrentHandler(SIGTERM), before_term.sa_handler);
  ASSERT_EQ(sigaction(SIGUSR1, &before_usr1, nullptr), 0);
  // A signal that cannot be caught fails Open on every rank.
  o.preemption.signals = {SIGKILL};
  auto bad = CheckpointManager::Open(MPI_COMM_WORLD, FreshDir("c"), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(SameOnAllRanks(bad.status()));
}

}  // namespace
}  // namespace mhckpt
