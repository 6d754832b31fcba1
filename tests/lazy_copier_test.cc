// coordinator/lazy_copier.h: a lazy save's copy fills the save's snapshot on
// a thread of its own (or on the caller's, when no thread is to be had), and
// its fence completes with the copy's outcome, which also becomes the save's.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "base/fault.h"
#include "coordinator/lazy_copier.h"
#include "coordinator/manager_impl.h"
#include "worker/staging_pool.h"

namespace mhckpt::internal {
namespace {

class LazyCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_.resize(64);
    std::iota(data_.begin(), data_.end(), 1.0f);
    ArrayToSave a;
    a.name = "w";
    a.dtype = DType::kFloat32;
    a.shape = {8, 8};
    a.shards.push_back({Box{{0, 0}, {8, 8}}, data_.data()});
    arrays_.push_back(std::move(a));
    job_.step = 7;
    ASSERT_TRUE(PrepareSnapshot(arrays_, so_, &job_.snapshot, &copies_).ok());
    so_.guarded = true;
    ASSERT_TRUE(AcquireStaging(so_, pool_, &job_.snapshot).ok());
  }
  void TearDown() override {
    ASSERT_TRUE(fault::Configure("").ok());
    if (job_.copier.joinable()) job_.copier.join();
    job_.snapshot = Snapshot();  // the buffer back to the pool
  }

  std::shared_ptr<LazyCopier> Copier(std::function<Status()> check = nullptr) {
    return std::make_shared<LazyCopier>(
        &job_, LazyCopier::Parts{copies_, so_, fence_, std::make_shared<WriteWatch>(),
                                 std::make_shared<CallerStreamMark>(), std::move(check),
                                 [this](const Status& s) {
                                   ++on_copied_calls_;
                                   on_copied_ = s;
                                 },
                                 "rank 0: save of step 7"});
  }

  const std::byte* Staged() const {
    return job_.snapshot.data(job_.snapshot.arrays.at(0).boxes.at(0));
  }

  std::vector<float> data_;
  std::vector<ArrayToSave> arrays_;
  SnapshotOptions so_;
  StagingPool pool_;
  SaveJob job_;
  std::vector<SnapshotCopy> copies_;
  std::shared_ptr<FenceState> fence_ = std::make_shared<FenceState>();
  int on_copied_calls_ = 0;
  Status on_copied_ = Internal("not called");
};

TEST_F(LazyCopierTest, CopiesOnItsOwnThreadThenCompletesTheFence) {
  EXPECT_TRUE(LazyCopier::Start(Copier()));
  ASSERT_TRUE(job_.copier.joinable());
  EXPECT_TRUE(fence_->Wait().ok());
  job_.copier.join();
  EXPECT_TRUE(fence_->Done());
  EXPECT_TRUE(job_.local.ok()) << job_.local.ToString();
  EXPECT_EQ(on_copied_calls_, 1);
  EXPECT_TRUE(on_copied_.ok());
  EXPECT_EQ(std::memcmp(Staged(), data_.data(), data_.size() * sizeof(float)), 0);
  EXPECT_GE(job_.timings.snapshot, 0.0);
}

TEST_F(LazyCopierTest, ARefusedThreadCopiesOnTheCallersThread) {
  ASSERT_TRUE(fault::Configure("point=copier_thread,action=eio").ok());
  EXPECT_FALSE(LazyCopier::Start(Copier()));
  EXPECT_FALSE(job_.copier.joinable());
  EXPECT_TRUE(fence_->Done());  // done before Start returned
  EXPECT_TRUE(fence_->Wait().ok());
  EXPECT_TRUE(job_.local.ok());
  EXPECT_EQ(std::memcmp(Staged(), data_.data(), data_.size() * sizeof(float)), 0);
}

TEST_F(LazyCopierTest, TheCopysErrorReachesTheFenceTheSaveAndOnCopied) {
  ASSERT_TRUE(fault::Configure("point=lazy_copy,action=eio,step=7").ok());
  LazyCopier::Start(Copier());
  Status s = fence_->Wait();
  EXPECT_FALSE(s.ok());
  if (job_.copier.joinable()) job_.copier.join();
  EXPECT_EQ(job_.local.code(), s.code());
  EXPECT_EQ(on_copied_calls_, 1);
  EXPECT_EQ(on_copied_.code(), s.code());
}

TEST_F(LazyCopierTest, ACheckAfterCopyFailsTheSave) {
  LazyCopier::Start(Copier([] { return DataLoss("changed under the copy"); }));
  Status s = fence_->Wait();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  if (job_.copier.joinable()) job_.copier.join();
  EXPECT_EQ(job_.local.code(), StatusCode::kDataLoss);
  EXPECT_EQ(on_copied_.code(), StatusCode::kDataLoss);
}

TEST_F(LazyCopierTest, AnEarlierErrorOfTheSaveStays) {
  job_.local = InvalidArgument("rank 0: a bad input");
  LazyCopier::Start(Copier());
  EXPECT_TRUE(fence_->Wait().ok());  // the copy itself went well
  if (job_.copier.joinable()) job_.copier.join();
  EXPECT_EQ(job_.local.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mhckpt::internal
