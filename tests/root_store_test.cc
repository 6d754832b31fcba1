// The root store's rules (io/root_store.h), the same cases against each
// implementation: the POSIX store on a fresh temporary directory and the
// in-memory store. No MPI: one process, a plain gtest main.
#include <stdlib.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "base/fault.h"
#include "io/catalog.h"
#include "io/layout.h"
#include "io/memory_root_store.h"
#include "io/posix_root_store.h"
#include "io/root_store.h"
#include "io/step_index.h"

namespace mhckpt::io {
namespace {

using ::testing::HasSubstr;

// One root under test, and what only a test (or a crash) does to it.
class Backend {
 public:
  virtual ~Backend() = default;
  /// A new store of the root, as another process would make it.
  virtual std::unique_ptr<RootStore> Open() = 0;
  /// Adds `bytes` of data to step `step` (creating it), as the data engine
  /// or an interrupted save leaves it.
  virtual void WriteData(int64_t step, uint64_t bytes) = 0;
  /// Replaces step `step`'s marker by `text`, bypassing the put protocol.
  virtual void WriteMarkerText(int64_t step, const std::string& text) = 0;
  /// A file the test may create, in a directory that outlives the test's
  /// threads (for fault gates).
  virtual std::string ScratchPath(const std::string& name) = 0;
};

std::string TempRoot() {
  const char* base = std::getenv("MHCKPT_TEST_DIR");
  std::string dir = std::string(base != nullptr && *base ? base : "/tmp") + "/root_store.XXXXXX";
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path());
  if (::mkdtemp(dir.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << dir;
  return dir;
}

class PosixBackend final : public Backend {
 public:
  PosixBackend() : scratch_(TempRoot()), root_(scratch_ + "/root") {}
  ~PosixBackend() override { std::filesystem::remove_all(scratch_); }
  std::unique_ptr<RootStore> Open() override { return std::make_unique<PosixRootStore>(root_); }
  void WriteData(int64_t step, uint64_t bytes) override {
    std::filesystem::create_directories(StepDir(root_, step));
    std::ofstream(DataPath(root_, step), std::ios::binary | std::ios::app)
        << std::string(bytes, 'x');
  }
  void WriteMarkerText(int64_t step, const std::string& text) override {
    std::filesystem::create_directories(StepDir(root_, step));
    std::ofstream(MarkerPath(root_, step), std::ios::binary | std::ios::trunc) << text;
  }
  std::string ScratchPath(const std::string& name) override { return scratch_ + "/" + name; }

 private:
  const std::string scratch_;
  const std::string root_;
};

class MemoryBackend final : public Backend {
 public:
  MemoryBackend() : scratch_(TempRoot()), root_(MemoryRootStore::New("memory-root")) {}
  ~MemoryBackend() override { std::filesystem::remove_all(scratch_); }
  std::unique_ptr<RootStore> Open() override { return root_->OpenAgain(); }
  void WriteData(int64_t step, uint64_t bytes) override { root_->AddData(step, bytes); }
  void WriteMarkerText(int64_t step, const std::string& text) override {
    root_->ReplaceMarkerText(step, text);
  }
  std::string ScratchPath(const std::string& name) override { return scratch_ + "/" + name; }

 private:
  const std::string scratch_;
  std::unique_ptr<MemoryRootStore> root_;
};

// A valid marker of `step` (no arrays), and its text.
Marker MarkerOf(int64_t step) {
  Marker m;
  m.step = step;
  m.world_size = 1;
  m.chunk_bytes = kChunkBytes;
  m.index.bytes = io::kIndexHeaderBytes;  // no boxes: the header alone
  return m;
}

class RootStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fault::Configure("").ok());
    if (GetParam() == "posix") {
      backend_ = std::make_unique<PosixBackend>();
    } else {
      backend_ = std::make_unique<MemoryBackend>();
    }
    store_ = backend_->Open();
    ASSERT_TRUE(store_->Create().ok());
  }
  void TearDown() override { ASSERT_TRUE(fault::Configure("").ok()); }

  // Creates step `step`, writes data into it and commits it.
  void Commit(int64_t step) {
    ASSERT_TRUE(store_->CreateStep(step).ok());
    backend_->WriteData(step, 100);
    ASSERT_TRUE(store_->SyncStep(step).ok());
    const Marker m = MarkerOf(step);
    ASSERT_TRUE(store_->PutMarker(m, MarkerToJson(m)).ok());
  }

  std::vector<int64_t> Committed() { return store_->CommittedSteps().value(); }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<RootStore> store_;
};

TEST_P(RootStoreTest, CreateMakesTheRoot) {
  auto fresh = GetParam() == "posix" ? std::unique_ptr<RootStore>(std::make_unique<PosixRootStore>(
                                           backend_->ScratchPath("new")))
                                     : std::unique_ptr<RootStore>(MemoryRootStore::New("new"));
  EXPECT_FALSE(fresh->Exists());
  ASSERT_TRUE(fresh->Create().ok());
  EXPECT_TRUE(fresh->Exists());
  EXPECT_TRUE(fresh->CheckWritable().ok());
  EXPECT_TRUE(fresh->Create().ok()) << "an existing root is not an error";
  EXPECT_TRUE(fresh->ListSteps().value().empty());
}

TEST_P(RootStoreTest, PutListGet) {
  ASSERT_TRUE(store_->CreateStep(3).ok());
  EXPECT_EQ(store_->StepsWithoutMarker().value(), std::vector<int64_t>{3});
  EXPECT_TRUE(Committed().empty()) << "a step without a marker is not committed";
  backend_->WriteData(3, 1000);
  ASSERT_TRUE(store_->SyncStep(3).ok());
  const Marker m = MarkerOf(3);
  const std::string text = MarkerToJson(m);
  ASSERT_TRUE(store_->PutMarker(m, text).ok());

  EXPECT_EQ(Committed(), std::vector<int64_t>{3});
  EXPECT_TRUE(store_->StepsWithoutMarker().value().empty());
  EXPECT_EQ(store_->GetMarker(3).value(), text);
  EXPECT_EQ(store_->ReadMarker(3).value().step, 3);
  EXPECT_GE(store_->StepBytes(3), 1000u + text.size());
  // Another store of the same root sees the same.
  EXPECT_EQ(backend_->Open()->CommittedSteps().value(), std::vector<int64_t>{3});
  EXPECT_THAT(store_->MarkerLocation(3), HasSubstr(store_->root()));
}

TEST_P(RootStoreTest, ListsAscendingWithGarbageAndDamage) {
  Commit(7);
  Commit(2);
  backend_->WriteData(5, 10);         // an interrupted save: no marker
  backend_->WriteMarkerText(4, "{");  // damage
  const Marker other = MarkerOf(9);   // a marker copied from another step
  backend_->WriteMarkerText(6, MarkerToJson(other));
  std::vector<StepEntry> all = store_->ListSteps().value();
  ASSERT_EQ(all.size(), 5u);
  std::vector<int64_t> steps;
  for (const StepEntry& e : all) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 5, 6, 7}));
  EXPECT_TRUE(all[0].committed && all[4].committed);
  EXPECT_FALSE(all[1].committed);
  EXPECT_EQ(all[1].marker.code(), StatusCode::kDataLoss) << all[1].marker.ToString();
  EXPECT_FALSE(all[2].committed);
  EXPECT_TRUE(all[2].marker.ok()) << "garbage, not damage";
  EXPECT_FALSE(all[3].committed);
  EXPECT_THAT(all[3].marker.message(), HasSubstr("says step 9"));
  EXPECT_EQ(Committed(), (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(store_->StepsWithoutMarker().value(), std::vector<int64_t>{5})
      << "an invalid marker is damage, kept for verify";
  EXPECT_EQ(store_->GetMarker(5).status().code(), StatusCode::kNotFound);
}

TEST_P(RootStoreTest, CreateStepRefusesACommittedStepAndClearsGarbage) {
  Commit(1);
  Status s = store_->CreateStep(1);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
  EXPECT_EQ(Committed(), std::vector<int64_t>{1});
  backend_->WriteData(2, 5000);
  ASSERT_TRUE(store_->CreateStep(2).ok());
  EXPECT_EQ(store_->StepBytes(2), 0u) << "what an earlier attempt left is gone";
  EXPECT_EQ(store_->StepsWithoutMarker().value(), std::vector<int64_t>{2});
}

TEST_P(RootStoreTest, RetireThenRemove) {
  Commit(1);
  Commit(2);
  Result<std::string> retired = store_->RetireStep(1);
  ASSERT_TRUE(retired.ok()) << retired.status().ToString();
  ASSERT_FALSE(retired->empty());
  EXPECT_EQ(Committed(), std::vector<int64_t>{2});
  EXPECT_EQ(store_->ListSteps().value().size(), 1u) << "a retired step is out of the listing";
  EXPECT_EQ(store_->GetMarker(1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->RetiredSteps().value(), std::vector<std::string>{*retired});
  ASSERT_TRUE(store_->RemoveRetired(*retired).ok());
  EXPECT_TRUE(store_->RetiredSteps().value().empty());
  EXPECT_TRUE(store_->RemoveRetired(*retired).ok()) << "a missing one is not an error";
  EXPECT_EQ(store_->RetireStep(1).value(), "") << "no step, nothing retired";
  // A step retired, saved again and retired again gets two names.
  Commit(1);
  std::string first = store_->RetireStep(1).value();
  Commit(1);
  std::string second = store_->RetireStep(1).value();
  EXPECT_NE(first, second);
  EXPECT_EQ(store_->RetiredSteps().value().size(), 2u);
  EXPECT_EQ(Committed(), std::vector<int64_t>{2});
}

TEST_P(RootStoreTest, RemoveRetiredTakesOnlyRetiredNames) {
  Commit(1);
  for (const std::string& name :
       {std::string("/etc"), store_->root(), store_->root() + "/step_0000000001",
        store_->root() + "/" + std::string(kRetiredPrefix) + "x/../../y"}) {
    Status s = store_->RemoveRetired(name);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.ToString();
  }
  EXPECT_EQ(Committed(), std::vector<int64_t>{1});
}

// Rule 3: a retirement that stops after its first part (the fault point
// `retention`) leaves the step uncommitted, never committed without data.
TEST_P(RootStoreTest, RetirementRemovesTheMarkerFirst) {
  Commit(1);
  ASSERT_TRUE(fault::Configure("point=retention,action=error").ok());
  Status s = store_->RetireStep(1).status();
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Committed().empty());
  EXPECT_EQ(store_->StepsWithoutMarker().value(), std::vector<int64_t>{1})
      << "the data is still there, as garbage";
  EXPECT_GT(store_->StepBytes(1), 0u);
}

TEST_P(RootStoreTest, RemovalRemovesTheMarkerFirst) {
  Commit(1);
  ASSERT_TRUE(fault::Configure("point=remove,action=eio").ok());
  Status s = store_->RemoveStep(1);
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_TRUE(Committed().empty()) << "the marker went first";
  ASSERT_TRUE(store_->RemoveStep(1).ok());
  EXPECT_TRUE(store_->ListSteps().value().empty());
  EXPECT_TRUE(store_->RemoveStep(1).ok()) << "a missing step is not an error";
}

TEST_P(RootStoreTest, DeleteStep) {
  Commit(1);
  Commit(2);
  ASSERT_TRUE(store_->DeleteStep(1).ok());
  EXPECT_EQ(Committed(), std::vector<int64_t>{2});
  EXPECT_TRUE(store_->RetiredSteps().value().empty());
  EXPECT_EQ(store_->ListSteps().value().size(), 1u);
  EXPECT_TRUE(store_->DeleteStep(1).ok());
}

TEST_P(RootStoreTest, OneOwnerAtATime) {
  EXPECT_EQ(store_->LeaseText().status().code(), StatusCode::kNotFound);
  Result<std::unique_ptr<RootOwnership>> first = store_->Acquire({});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE((*first)->taken_over());
  const Lease lease = ParseLease(store_->LeaseText().value()).value();
  EXPECT_EQ(lease.pid, ::getpid());

  std::unique_ptr<RootStore> other = backend_->Open();
  for (RootStore* s : {store_.get(), other.get()}) {
    Result<std::unique_ptr<RootOwnership>> second = s->Acquire({});
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition)
        << second.status().ToString();
    EXPECT_THAT(second.status().message(),
                HasSubstr("checkpoint root '" + store_->root() + "' is in use by another job"));
  }
  first->reset();  // released
  EXPECT_EQ(store_->LeaseText().status().code(), StatusCode::kNotFound);
  Result<std::unique_ptr<RootOwnership>> third = other->Acquire({});
  EXPECT_TRUE(third.ok()) << third.status().ToString();
}

// A second Acquire that waits gets the root once the holder leaves. The
// holder leaves only after the waiter has found the root in use (the fault
// gate `root_busy`, base/fault.h), so the test does not depend on timing.
TEST_P(RootStoreTest, AcquireWaitsForTheHolder) {
  Result<std::unique_ptr<RootOwnership>> first = store_->Acquire({});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string gate = backend_->ScratchPath("gate");
  ASSERT_TRUE(fault::Configure("point=root_busy,action=wait,times=1,file=" + gate).ok());
  std::unique_ptr<RootStore> other = backend_->Open();
  Result<std::unique_ptr<RootOwnership>> second = Internal("not run");
  std::thread waiter([&] { second = other->Acquire({60, 60}); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(gate + ".reached") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling, with a deadline
  }
  const bool reached = std::filesystem::exists(gate + ".reached");
  first->reset();
  std::ofstream(gate) << "go";
  waiter.join();
  ASSERT_TRUE(reached) << "the waiter never found the root in use";
  EXPECT_EQ(fault::Fired(), 1);
  EXPECT_TRUE(second.ok()) << second.status().ToString();
}

TEST_P(RootStoreTest, AcquireWithoutWaitingFailsAtOnce) {
  Result<std::unique_ptr<RootOwnership>> first = store_->Acquire({});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(fault::Configure("point=root_busy,action=error").ok());
  Result<std::unique_ptr<RootOwnership>> second = backend_->Open()->Acquire({60, 0});
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fault::Fired(), 0) << "wait_seconds 0: no wait";
}

INSTANTIATE_TEST_SUITE_P(Stores, RootStoreTest, ::testing::Values("posix", "memory"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace mhckpt::io
