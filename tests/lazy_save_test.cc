// Lazy saves (SaveOptions::copy = CopyMode::kLazy) and staging built ahead
// (Options::staging_reserve_bytes): the bytes restored are the bytes at the
// time of the fence; a buffer that becomes unreadable during the copy, or a
// layer above that reports a donated array, fails the save on every rank
// with the same error and leaves no commit marker; a watched buffer is
// writable again after the fence.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"
#include "worker/copy.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

// One array of `rows` rows of 1 KiB per rank, row-sharded, in page-aligned
// memory of its own (so that a test may protect or unmap it).
class Buffer {
 public:
  explicit Buffer(int64_t rows_per_rank) : rows_(rows_per_rank) {
    bytes_ = static_cast<size_t>(rows_) * kCols * 4;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~Buffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  static constexpr int64_t kCols = 256;
  [[nodiscard]] std::vector<int64_t> Shape() const { return {rows_ * Size(), kCols}; }
  [[nodiscard]] Box LocalBox() const { return Box{{rows_ * Rank(), 0}, {rows_, kCols}}; }
  // Fills the buffer with the values of `seed`; returns them.
  std::vector<std::byte> Set(uint64_t seed) {
    std::vector<std::byte> v = Fill(DType::kFloat32, Shape(), LocalBox(), seed);
    std::memcpy(data_, v.data(), v.size());
    return v;
  }
  [[nodiscard]] std::vector<ArrayToSave> Arrays(const std::string& name) const {
    return {{name, DType::kFloat32, Shape(), {Shard{LocalBox(), data_}}}};
  }
  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] size_t bytes() const { return bytes_; }

 private:
  int64_t rows_;
  size_t bytes_ = 0;
  std::byte* data_ = nullptr;
};

std::vector<std::byte> RestoreLocal(CheckpointManager& m, int64_t step, const Buffer& like,
                                    const std::string& name, Status* s) {
  std::vector<std::byte> out(like.bytes());
  std::vector<ArrayToRestore> r{{name, DType::kFloat32, {{like.LocalBox(), out.data()}}}};
  *s = m.Restore(step, r);
  return out;
}

SaveOptions Lazy() {
  SaveOptions so;
  so.copy = CopyMode::kLazy;
  return so;
}

TEST(LazySave, RestoresTheBytesOfTheFenceAfterTheBuffersAreOverwritten) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->async()) << "lazy saves need the asynchronous path";
  Buffer buf(300);
  std::vector<std::vector<std::byte>> saved;
  std::atomic<int> callbacks{0};
  for (int step = 0; step < 3; ++step) {
    saved.push_back(buf.Set(100 + step));
    SaveOptions so = Lazy();
    so.on_copied = [&callbacks](const Status& s) {
      if (s.ok()) ++callbacks;
    };
    SaveFence fence;
    ASSERT_TRUE(m->Save(step, buf.Arrays("w"), {}, so, &fence).ok());
    ASSERT_TRUE(fence.Wait().ok());
    EXPECT_TRUE(fence.Done());
    // The training step after the fence overwrites what was saved.
    std::memset(buf.data(), 0xEE, buf.bytes());
  }
  Status s = m->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(callbacks.load(), 3);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::byte> got = RestoreLocal(*m, step, buf, "w", &s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(got == saved[step]) << "step " << step;
  }
}

// A blocking save right after a lazy one, while the lazy copy has not
// started (held at a gate), with the default budget of one save: the lazy
// save took its staging when Save was called, so the blocking save waits for
// it instead of taking it first and leaving the lazy copy waiting for memory
// that only the I/O thread, itself waiting for that copy, would give back.
TEST(LazySave, ABlockingSaveAfterALazyOneWaitsForItsStagingInsteadOfTakingIt) {
  const std::string dir = FreshDir();
  auto m = OpenForTest(dir);
  ASSERT_TRUE(m);
  Buffer buf(300);
  const std::string gate = fmt::format("{}/gate.{}", dir, Rank());
  ASSERT_TRUE(fault::Configure(fmt::format("point=lazy_copy,action=wait,file={}", gate)).ok());
  std::vector<std::byte> first = buf.Set(7);
  SaveFence fence;
  ASSERT_TRUE(m->Save(1, buf.Arrays("w"), {}, Lazy(), &fence).ok());
  // Opens the gate once the copier is held there and a moment has passed in
  // which the blocking save below would have taken the memory.
  std::thread opener([&gate] {
    while (access((gate + ".reached").c_str(), F_OK) != 0) usleep(1000);
    usleep(200 * 1000);
    if (FILE* f = std::fopen(gate.c_str(), "w")) std::fclose(f);
  });
  // The lazy save's buffer stays as it was until its fence; the blocking
  // save's bytes are the same, so its buffer is a copy.
  std::vector<std::byte> second(buf.data(), buf.data() + buf.bytes());
  std::vector<ArrayToSave> a{
      {"w", DType::kFloat32, buf.Shape(), {Shard{buf.LocalBox(), second.data()}}}};
  Status saved = m->Save(2, a);
  opener.join();
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  ASSERT_TRUE(fence.Wait().ok());
  Status s = m->WaitUntilFinished();
  ASSERT_TRUE(fault::Configure("").ok());
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int step : {1, 2}) {
    std::vector<std::byte> got = RestoreLocal(*m, step, buf, "w", &s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(got == first) << "step " << step;
  }
}

TEST(LazySave, UnreadableBufferFailsTheSaveOnEveryRankNamingTheArray) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  Buffer buf(64);
  buf.Set(7);
  const int bad = Size() - 1;
  // As if freed under the copy: the copier's read of it faults.
  if (Rank() == bad) ASSERT_EQ(mprotect(buf.data(), buf.bytes(), PROT_NONE), 0);
  SaveFence fence;
  ASSERT_TRUE(m->Save(5, buf.Arrays("params/w"), {}, Lazy(), &fence).ok());
  Status copied = fence.Wait();
  if (Rank() == bad) {
    ASSERT_EQ(mprotect(buf.data(), buf.bytes(), PROT_READ | PROT_WRITE), 0);
    EXPECT_EQ(copied.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(copied.message().find("params/w"), std::string::npos) << copied.ToString();
  } else {
    EXPECT_TRUE(copied.ok()) << copied.ToString();
  }
  Status s = m->WaitUntilFinished();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("params/w"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("rank " + std::to_string(bad)), std::string::npos) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  auto steps = m->CommittedSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty()) << "no commit marker after a failed save";
}

TEST(LazySave, CheckAfterCopyErrorFailsTheSaveOnEveryRank) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  Buffer buf(16);
  buf.Set(3);
  SaveOptions so = Lazy();
  // What the Python package reports for a jax.Array donated during the copy.
  if (Rank() == 0) {
    so.check_after_copy = [] {
      return InvalidArgument("rank 0: array 'w' was donated before its save's fence");
    };
  }
  SaveFence fence;
  ASSERT_TRUE(m->Save(1, buf.Arrays("w"), {}, so, &fence).ok());
  EXPECT_EQ(fence.Wait().ok(), Rank() != 0);
  Status s = m->WaitUntilFinished();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("donated"), std::string::npos) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  auto steps = m->CommittedSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty());
  // The manager goes on: the next save commits.
  ASSERT_TRUE(m->Save(2, buf.Arrays("w"), {}, Lazy()).ok());
  EXPECT_TRUE(m->WaitUntilFinished().ok());
}

TEST(LazySave, WatchedBuffersAreWritableAgainAfterTheFence) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  Buffer buf(200);
  std::vector<std::byte> saved = buf.Set(11);
  SaveOptions so = Lazy();
  so.protect_host = true;
  SaveFence fence;
  ASSERT_TRUE(m->Save(0, buf.Arrays("w"), {}, so, &fence).ok());
  ASSERT_TRUE(fence.Wait().ok());
  std::memset(buf.data(), 0x11, buf.bytes());  // would kill the process if still watched
  Status s = m->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::byte> got = RestoreLocal(*m, 0, buf, "w", &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == saved);
}

TEST(LazySave, InputErrorsAreReturnedBySaveAsWhenBlocking) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  Buffer buf(8);
  std::vector<ArrayToSave> a = buf.Arrays("w");
  if (Rank() == 0) a[0].shards[0].box.start[0] = buf.Shape()[0] - 7;  // one row beyond the array
  SaveFence fence;
  Status local = m->Save(0, a, {}, Lazy(), &fence);
  EXPECT_EQ(local.ok(), Rank() != 0);
  (void)fence.Wait();
  Status s = m->WaitUntilFinished();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
}

// Without a usable CUDA device (tests/gpu_test.cc covers the device path
// where there is one): a lazy save of a device box beside a host box fails
// at Save, naming the array, as a blocking one does; the host box's copy
// still runs and the fence completes; the save fails on every rank.
TEST(LazySave, DeviceBoxWithoutADeviceIsAnInputError) {
  if (internal::CudaAvailable()) GTEST_SKIP() << "a CUDA device is usable: gpu_test covers it";
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  Buffer buf(8);
  std::vector<ArrayToSave> a = buf.Arrays("w");
  std::vector<std::byte> device_like(64);
  if (Rank() == 0) {
    a.push_back(
        {"d", DType::kFloat32, {16}, {Shard{FullBox({16}), device_like.data(), Memory::kCuda}}});
  } else {
    a.push_back({"d", DType::kFloat32, {16}, {}});
  }
  SaveFence fence;
  Status local = m->Save(0, a, {}, Lazy(), &fence);
  EXPECT_EQ(local.ok(), Rank() != 0) << local.ToString();
  if (Rank() == 0) {
    EXPECT_NE(local.message().find("array 'd'"), std::string::npos) << local.ToString();
  }
  EXPECT_TRUE(fence.Wait().ok());
  Status s = m->WaitUntilFinished();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
}

// The ownership contract of a lazy save (CopyMode::kLazy): the caller owns
// every Shard::data buffer until the copy has ended -- SaveFence::Wait has
// returned, or on_copied has been called -- and may free or reuse it from
// then on, while the save is still being written and committed. Here every
// buffer is a heap allocation of its own (so that AddressSanitizer, which
// this test runs under in scripts/test.sh, reports any read of it after it
// is freed): a row shard, a replicated array (written by rank 0 after the
// plan, from staging, never from caller memory) and a one-element counter.
// Some are freed inside on_copied, the rest right after the fence, and
// their memory is reallocated and overwritten before the commit; the step
// restores bit-exactly. Also when this rank's Save returns an input error:
// the copier still reads the valid boxes, so the buffers are the caller's
// until the fence all the same.
TEST(LazySave, CallerFreesAndReusesEveryBufferOnceTheCopyHasEnded) {
  auto m = OpenForTest(FreshDir());
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->async()) << "lazy saves need the asynchronous path";
  constexpr int64_t kRows = 96;
  constexpr int64_t kCols = 64;
  const std::vector<int64_t> rows_shape{kRows * Size(), kCols};
  const Box rows_box{{kRows * Rank(), 0}, {kRows, kCols}};
  const std::vector<int64_t> rep_shape{33, 17};
  const std::vector<int64_t> counter_shape{};
  for (int step = 0; step < 4; ++step) {
    const uint64_t seed = 500 + static_cast<uint64_t>(step);
    struct Held {
      std::string name;
      DType dtype;
      std::vector<int64_t> shape;
      Box box;
      std::vector<std::byte> want;
      std::byte* data = nullptr;
    };
    std::vector<Held> held;
    held.push_back({"rows", DType::kFloat32, rows_shape, rows_box, {}});
    held.push_back({"rep", DType::kFloat64, rep_shape, FullBox(rep_shape), {}});
    held.push_back({"counter", DType::kInt64, counter_shape, FullBox(counter_shape), {}});
    std::vector<ArrayToSave> arrays;
    for (Held& h : held) {
      h.want = Fill(h.dtype, h.shape, h.box, seed);
      h.data = new std::byte[h.want.size()];
      std::memcpy(h.data, h.want.data(), h.want.size());
      arrays.push_back({h.name, h.dtype, h.shape, {Shard{h.box, h.data}}});
    }
    // Step 3: an input error on rank 0 (a second array whose box lies outside
    // it); the valid boxes are still copied, and the save fails everywhere.
    const bool bad = step == 3;
    std::vector<std::byte> outside(16);
    if (bad) {
      arrays.push_back({"bad", DType::kInt32, {4}, {}});
      if (Rank() == 0) arrays.back().shards.push_back(Shard{Box{{8}, {4}}, outside.data()});
    }
    SaveOptions so = Lazy();
    // The first two buffers are freed as soon as the copy has ended, on the
    // copying thread, before the fence completes.
    so.on_copied = [&held](const Status&) {
      for (size_t i = 0; i < 2; ++i) {
        delete[] held[i].data;
        held[i].data = nullptr;
      }
    };
    SaveFence fence;
    Status local = m->Save(step, arrays, {}, so, &fence);
    EXPECT_EQ(local.ok(), !bad || Rank() != 0) << local.ToString();
    arrays.clear();
    (void)fence.Wait();
    for (Held& h : held) {
      delete[] h.data;  // the last one here; the others are null by now
      h.data = nullptr;
    }
    // The memory freed is handed out again and overwritten while the save is
    // planned, written and committed.
    std::vector<std::unique_ptr<std::byte[]>> churn;
    for (int i = 0; i < 64; ++i) {
      for (const Held& h : held) {
        churn.emplace_back(new std::byte[h.want.size()]);
        std::memset(churn.back().get(), 0xA5, h.want.size());
      }
    }
    Status s = m->WaitUntilFinished();
    if (bad) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find("'bad'"), std::string::npos) << s.ToString();
      EXPECT_TRUE(SameOnAllRanks(s));
      continue;
    }
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
    churn.clear();
    for (const Held& h : held) {
      std::vector<std::byte> got(h.want.size());
      std::vector<ArrayToRestore> r{{h.name, h.dtype, {{h.box, got.data()}}}};
      s = m->Restore(step, r);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(got == h.want) << "step " << step << " array '" << h.name << "'";
    }
  }
  auto steps = m->CommittedSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{0, 1, 2}));
}

TEST(StagingReserve, OpenMapsStagingAheadAndTheFirstSaveUsesIt) {
  Buffer buf(1024);  // 1 MiB per rank
  Options o;
  o.staging_reserve_bytes = buf.bytes();
  auto m = OpenForTest(FreshDir(), o);
  ASSERT_TRUE(m);
  const size_t reserved = m->StagingBytes();
  EXPECT_GE(reserved, buf.bytes());
  std::vector<std::byte> saved = buf.Set(5);
  ASSERT_TRUE(m->Save(0, buf.Arrays("w")).ok());
  Status s = m->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(m->StagingBytes(), reserved) << "the first save mapped staging of its own";
  std::vector<std::byte> got = RestoreLocal(*m, 0, buf, "w", &s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == saved);
  // A second Reserve of what is held already maps nothing.
  ASSERT_TRUE(m->Reserve(buf.bytes()).ok());
  EXPECT_EQ(m->StagingBytes(), reserved);
}

}  // namespace
}  // namespace mhckpt
