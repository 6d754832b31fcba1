// worker/fault_guard.h: a copy from memory that faults under it is an error,
// not a crash; a write to a watched buffer is a named failure; a watched
// buffer is writable again after Release, and the partial pages at its ends
// are never watched.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "worker/copy.h"
#include "worker/fault_guard.h"

namespace mhckpt::internal {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Anonymous pages of their own, unmapped at the end of the test.
struct Pages {
  explicit Pages(size_t n) : bytes(n * kPage) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Pages() {
    if (data != nullptr) munmap(data, bytes);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  size_t bytes;
  char* data;
};

TEST(GuardedCopy, CopiesReadableMemory) {
  Pages src(3);
  ASSERT_NE(src.data, nullptr);
  for (size_t i = 0; i < src.bytes; ++i) src.data[i] = static_cast<char>(i * 7);
  std::vector<char> dst(src.bytes);
  EXPECT_TRUE(GuardedCopy(dst.data(), src.data, src.bytes));
  EXPECT_EQ(std::memcmp(dst.data(), src.data, src.bytes), 0);
}

TEST(GuardedCopy, SourceUnmappedUnderItIsReportedNotFatal) {
  Pages src(4);
  ASSERT_NE(src.data, nullptr);
  std::vector<char> dst(src.bytes);
  ASSERT_EQ(munmap(src.data + 2 * kPage, kPage), 0);  // a hole, as a buffer freed mid-copy
  EXPECT_FALSE(GuardedCopy(dst.data(), src.data, src.bytes));
  // The thread goes on copying afterwards.
  EXPECT_TRUE(GuardedCopy(dst.data(), src.data, 2 * kPage));
  munmap(src.data, 2 * kPage);
  munmap(src.data + 3 * kPage, kPage);
  src.data = nullptr;
}

TEST(ParallelGuardedCopy, NamesTheTaskWhoseSourceFaulted) {
  std::vector<char> a(40 << 20, 'a'), out_a(a.size()), out_c(kPage);
  Pages b(2);
  std::vector<char> out_b(b.bytes);
  ASSERT_EQ(mprotect(b.data, b.bytes, PROT_NONE), 0);
  std::vector<CopyTask> tasks{{out_a.data(), a.data(), a.size()},
                              {out_b.data(), b.data, b.bytes},
                              {out_c.data(), a.data(), kPage}};
  std::optional<size_t> bad = ParallelGuardedCopy(tasks, 3);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(*bad, 1u);
  ASSERT_EQ(mprotect(b.data, b.bytes, PROT_READ | PROT_WRITE), 0);
  EXPECT_FALSE(ParallelGuardedCopy(tasks, 3).has_value());
}

TEST(WriteWatchDeathTest, AWriteToAWatchedBufferAbortsNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Pages buf(4);
        WriteWatch watch;
        if (!watch.Protect({{buf.data, buf.bytes, "array 'params/w' box [0:8)\n"}}).ok()) return;
        buf.data[kPage + 5] = 1;
      },
      "array 'params/w' box");
}

TEST(WriteWatch, ReleaseMakesTheBufferWritableAndEndsAreNeverWatched) {
  Pages buf(4);
  ASSERT_NE(buf.data, nullptr);
  WriteWatch watch;
  // From the middle of the first page to the middle of the last: the two
  // whole pages between are watched, the partial ones not.
  ASSERT_TRUE(watch.Protect({{buf.data + kPage / 2, 3 * kPage, "x\n"}}).ok());
  EXPECT_EQ(watch.watched_bytes(), 2 * kPage);
  buf.data[0] = 1;                    // partial first page: writable
  buf.data[3 * kPage + 100] = 1;      // partial last page: writable
  EXPECT_EQ(buf.data[kPage + 1], 0);  // watched pages stay readable
  watch.Release();
  EXPECT_EQ(watch.watched_bytes(), 0u);
  std::memset(buf.data, 2, buf.bytes);
  EXPECT_EQ(buf.data[2 * kPage], 2);
}

}  // namespace
}  // namespace mhckpt::internal
