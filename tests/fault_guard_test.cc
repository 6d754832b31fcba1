// worker/fault_guard.h: a copy from memory that faults under it is an error,
// not a crash; a write to a watched buffer is a named failure; a watched
// buffer is writable again after Release, and the partial pages at its ends
// are never watched; pages that were not writable before Protect keep their
// protection; a fault handled after Release neither kills the process nor
// uninstalls the handler, and a genuine fault still ends the process.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
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

TEST(GuardedCopyUncached, CopiesThenReadsTheSourceUnderTheGuard) {
  Pages src(3);
  ASSERT_NE(src.data, nullptr);
  for (size_t i = 0; i < src.bytes; ++i) src.data[i] = static_cast<char>(i * 13);
  std::vector<char> dst(src.bytes + 1);
  size_t read_bytes = 0;
  const void* read_at = nullptr;
  // An odd destination address: the streaming stores' unaligned head and tail.
  EXPECT_TRUE(
      GuardedCopyUncached(dst.data() + 1, src.data, src.bytes, [&](const void* data, size_t bytes) {
        read_at = data;
        read_bytes = bytes;
      }));
  EXPECT_EQ(std::memcmp(dst.data() + 1, src.data, src.bytes), 0);
  EXPECT_EQ(read_at, src.data);
  EXPECT_EQ(read_bytes, src.bytes);
}

TEST(GuardedCopyUncached, AFaultInTheCopyOrInTheReadIsReportedNotFatal) {
  Pages src(4);
  ASSERT_NE(src.data, nullptr);
  std::vector<char> dst(src.bytes);
  ASSERT_EQ(munmap(src.data + 2 * kPage, kPage), 0);  // a buffer freed mid-copy
  bool read = false;
  EXPECT_FALSE(GuardedCopyUncached(dst.data(), src.data, src.bytes,
                                   [&](const void*, size_t) { read = true; }));
  EXPECT_FALSE(read);
  // The copy is whole, the read after it faults (the source freed between).
  const char* hole = src.data + 2 * kPage;
  EXPECT_FALSE(GuardedCopyUncached(dst.data(), src.data, kPage, [&](const void*, size_t) {
    read = true;
    volatile char c = *hole;
    (void)c;
  }));
  EXPECT_TRUE(read);
  // The thread goes on copying afterwards.
  EXPECT_TRUE(GuardedCopyUncached(dst.data(), src.data, 2 * kPage, [](const void*, size_t) {}));
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

// The protection of the page at `p` now, from /proc/self/maps (-1: unmapped).
int ProtectionOf(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;  // NOLINT(google-runtime-int)
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (addr < lo || addr >= hi) continue;
    return (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
           (perms[2] == 'x' ? PROT_EXEC : 0);
  }
  return -1;
}

TEST(WriteWatch, ReleaseGivesEachPageBackItsProtection) {
  Pages buf(4);
  ASSERT_NE(buf.data, nullptr);
  // Page 1 read-only and page 3 inaccessible before the watch (e.g. a
  // guard page of the caller's allocator); pages 0 and 2 writable.
  ASSERT_EQ(mprotect(buf.data + kPage, kPage, PROT_READ), 0);
  ASSERT_EQ(mprotect(buf.data + 3 * kPage, kPage, PROT_NONE), 0);
  WriteWatch watch;
  ASSERT_TRUE(watch.Protect({{buf.data, buf.bytes, "x\n"}}).ok());
  EXPECT_EQ(watch.watched_bytes(), 2 * kPage);  // the writable pages only
  EXPECT_EQ(ProtectionOf(buf.data), PROT_READ);
  EXPECT_EQ(ProtectionOf(buf.data + kPage), PROT_READ);
  EXPECT_EQ(ProtectionOf(buf.data + 2 * kPage), PROT_READ);
  EXPECT_EQ(ProtectionOf(buf.data + 3 * kPage), PROT_NONE);
  watch.Release();
  EXPECT_EQ(ProtectionOf(buf.data), PROT_READ | PROT_WRITE);
  EXPECT_EQ(ProtectionOf(buf.data + kPage), PROT_READ);
  EXPECT_EQ(ProtectionOf(buf.data + 2 * kPage), PROT_READ | PROT_WRITE);
  EXPECT_EQ(ProtectionOf(buf.data + 3 * kPage), PROT_NONE);
  buf.data[2 * kPage] = 3;
  EXPECT_EQ(buf.data[2 * kPage], 3);
}

TEST(WriteWatch, PartNotMappedIsAnErrorAndReleasesTheRest) {
  Pages buf(3);
  ASSERT_NE(buf.data, nullptr);
  ASSERT_EQ(munmap(buf.data + 2 * kPage, kPage), 0);
  WriteWatch watch;
  Status s = watch.Protect({{buf.data, buf.bytes, "array 'a'\n"}});
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("array 'a'"), std::string::npos) << s.ToString();
  EXPECT_EQ(watch.watched_bytes(), 0u);
  EXPECT_EQ(ProtectionOf(buf.data), PROT_READ | PROT_WRITE);
  munmap(buf.data, 2 * kPage);
  buf.data = nullptr;
}

// What the kernel delivers for a write to a write-protected page at `addr`
// (SIGSEGV, SEGV_ACCERR), sent to this thread: it is handled before the
// call returns, as a fault in flight is handled after it was raised.
void DeliverFault(void* addr) {
  siginfo_t info{};
  info.si_signo = SIGSEGV;
  info.si_code = SEGV_ACCERR;
  info.si_addr = addr;
  ASSERT_EQ(syscall(SYS_rt_tgsigqueueinfo, getpid(), gettid(), SIGSEGV, &info), 0);
}

TEST(WriteWatch, AFaultHandledAfterReleaseKeepsTheHandler) {
  Pages buf(2), hole(1);
  ASSERT_NE(buf.data, nullptr);
  WriteWatch watch;
  ASSERT_TRUE(watch.Protect({{buf.data, buf.bytes, "x\n"}}).ok());
  struct sigaction ours {};
  ASSERT_EQ(sigaction(SIGSEGV, nullptr, &ours), 0);
  ASSERT_NE(ours.sa_flags & SA_SIGINFO, 0);
  // A write faulted on the watched page; the copy ends and Release runs
  // before the fault reaches the handler.
  watch.Release();
  DeliverFault(buf.data + 10);
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGSEGV, nullptr, &now), 0);
  const bool kept = (now.sa_flags & SA_SIGINFO) != 0 && now.sa_sigaction == ours.sa_sigaction;
  if (!kept) sigaction(SIGSEGV, &ours, nullptr);  // for the tests that follow
  EXPECT_TRUE(kept) << "the handler was replaced by the disposition from before mhckpt";
  buf.data[10] = 1;  // the write's retry succeeds
  EXPECT_EQ(buf.data[10], 1);
  // Guarded copies still turn a fault into an error.
  ASSERT_EQ(munmap(hole.data, hole.bytes), 0);
  std::vector<char> dst(kPage);
  EXPECT_FALSE(GuardedCopy(dst.data(), hole.data, kPage));
  hole.data = nullptr;
}

TEST(WriteWatchDeathTest, AGenuineFaultStillEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A write to a page that was read-only before the watch: not watched, so
  // it faults as without mhckpt (after one retry), and the process dies of
  // SIGSEGV rather than looping or aborting with the watch's message.
  EXPECT_EXIT(
      {
        Pages buf(2);
        mprotect(buf.data, kPage, PROT_READ);
        WriteWatch watch;
        if (!watch.Protect({{buf.data, buf.bytes, "watched\n"}}).ok()) std::_Exit(3);
        *static_cast<volatile char*>(buf.data + 1) = 1;
        std::_Exit(4);
      },
      ::testing::KilledBySignal(SIGSEGV), "");
  // Once released too.
  EXPECT_EXIT(
      {
        Pages buf(1);
        WriteWatch watch;
        if (!watch.Protect({{buf.data, buf.bytes, "watched\n"}}).ok()) std::_Exit(3);
        watch.Release();
        mprotect(buf.data, kPage, PROT_READ);
        *static_cast<volatile char*>(buf.data + 1) = 1;
        std::_Exit(4);
      },
      ::testing::KilledBySignal(SIGSEGV), "");
}

}  // namespace
}  // namespace mhckpt::internal
