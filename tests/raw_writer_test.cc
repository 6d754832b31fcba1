// io/raw_writer.h: runs of every alignment (file offset and memory), short
// and long, written by the pool's threads into one file, with and without
// O_DIRECT, read back byte for byte; errors name the file. Where the temp
// directory's file system refuses O_DIRECT, the direct cases check the
// buffered fallback and report themselves skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "io/raw_writer.h"
#include "tests/direct_probe.h"

namespace mhckpt {
namespace {

std::string TempDir() {
  auto dir = std::filesystem::temp_directory_path() / "mhckpt-raw-writer-test";
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string TempFile(const std::string& name) {
  std::string path = TempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc).close();
  return path;
}

std::vector<std::byte> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {reinterpret_cast<std::byte*>(c.data()),
          reinterpret_cast<std::byte*>(c.data()) + c.size()};
}

void WriteAndCheck(bool direct, int threads) {
  const std::string path = TempFile(direct ? "direct" : "buffered");
  // Source bytes, and runs: {file offset, source offset, size}. Sources at
  // odd offsets force the bounce buffer; file offsets off a page force heads
  // and tails; a 20 MiB run is cut into chunks over the threads.
  std::vector<std::byte> src(48 << 20);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<std::byte>((i * 131 + i / 4093) & 0xFF);
  struct R {
    uint64_t offset;
    size_t from, size;
  };
  const std::vector<R> runs{{0, 0, 100},
                            {100, 100, 3996},
                            {4096, 4096, 1 << 20},                    // aligned both sides
                            {(1 << 20) + 4096, 17, (1 << 20) + 5},    // memory off a page
                            {(3 << 20) + 333, 333, 20 << 20},         // long, unaligned start
                            {(24 << 20), (30 << 20) + 1, 300 << 10},  // short-ish, bounce
                            {(25 << 20), (40 << 20), 7}};
  io::RawFile file;
  ASSERT_TRUE(file.Open(path, direct).ok());
  io::RawWriterPool pool(threads);
  std::vector<io::RawRun> raw;
  raw.reserve(runs.size());
  for (const R& r : runs) raw.push_back({r.offset, src.data() + r.from, r.size});
  pool.Submit(&file, raw);
  ASSERT_TRUE(pool.Wait().ok());
  const uint64_t direct_bytes = file.direct_bytes();
  ASSERT_TRUE(file.SyncAndClose().ok());
  std::vector<std::byte> got = ReadAll(path);
  for (const R& r : runs) {
    ASSERT_GE(got.size(), r.offset + r.size);
    EXPECT_TRUE(std::equal(got.begin() + static_cast<ptrdiff_t>(r.offset),
                           got.begin() + static_cast<ptrdiff_t>(r.offset + r.size),
                           src.begin() + static_cast<ptrdiff_t>(r.from)))
        << "run at " << r.offset << " (" << r.size << " bytes), direct " << direct;
  }
  std::filesystem::remove(path);
  const std::string refused = testing::DirectIoRefused(TempDir());
  if (!direct || !refused.empty()) {
    EXPECT_EQ(direct_bytes, 0u);
  } else {
    // The whole pages of the 1 MiB and 20 MiB runs at least.
    EXPECT_GE(direct_bytes, uint64_t{20} << 20) << "the long runs went through the page cache";
  }
  if (direct && !refused.empty()) GTEST_SKIP() << refused;
}

TEST(RawWriter, BufferedRunsLandWhereTold) { WriteAndCheck(false, 3); }
TEST(RawWriterDirect, RunsLandWhereTold) { WriteAndCheck(true, 1); }
TEST(RawWriterDirect, RunsFromSeveralThreads) { WriteAndCheck(true, 4); }

// Small runs side by side in the file, from scattered unaligned memory and
// given in any order (the small arrays HDF5 packs together): joined into
// pieces whose whole pages go through O_DIRECT, gathered in the bounce
// buffer; a gap starts a new piece, and a piece too short stays buffered.
void SmallRunsTogether(bool direct) {
  const std::string path = TempFile(direct ? "small-direct" : "small-buffered");
  std::vector<std::byte> src(24 << 20);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<std::byte>((i * 197 + i / 1021) & 0xFF);
  std::vector<io::RawRun> runs;
  uint64_t at = 777, from = 3;
  auto group = [&](int count) {
    const uint64_t begin = at;
    for (int i = 0; i < count; ++i) {
      const size_t size = 1 + (static_cast<size_t>(i) * 7919) % 70000;  // 1 B to 68 KiB
      runs.push_back({at, src.data() + from, size});
      at += size;
      from += size + 13;  // never contiguous in memory
    }
    return std::pair(begin, at);
  };
  const auto [b1, e1] = group(400);  // ~14 MB: two pieces, cut at a page boundary
  at += 5000;                        // a gap: metadata between the groups
  const auto [b2, e2] = group(3);    // ~10 KB: too short for O_DIRECT
  at += 1;
  const auto [b3, e3] = group(40);  // ~1.4 MB
  std::vector<io::RawRun> shuffled = runs;
  std::reverse(shuffled.begin(), shuffled.end());
  std::swap(shuffled[5], shuffled[200]);
  io::RawFile file;
  ASSERT_TRUE(file.Open(path, direct).ok());
  io::RawWriterPool pool(2);
  pool.Submit(&file, shuffled);
  ASSERT_TRUE(pool.Wait().ok());
  const bool still_direct = file.direct();
  const uint64_t direct_bytes = file.direct_bytes();
  ASSERT_TRUE(file.SyncAndClose().ok());
  std::vector<std::byte> got = ReadAll(path);
  for (const io::RawRun& r : runs) {
    ASSERT_GE(got.size(), r.offset + r.size);
    ASSERT_TRUE(std::equal(r.src, r.src + r.size, got.begin() + static_cast<ptrdiff_t>(r.offset)))
        << "run at " << r.offset << " (" << r.size << " bytes), direct " << direct;
  }
  auto pages = [](uint64_t b, uint64_t e) {
    const uint64_t a = (b + io::kDirectAlign - 1) / io::kDirectAlign * io::kDirectAlign;
    const uint64_t z = e / io::kDirectAlign * io::kDirectAlign;
    return z > a ? z - a : 0;
  };
  std::filesystem::remove(path);
  const std::string refused = testing::DirectIoRefused(TempDir());
  if (!direct || !refused.empty()) {
    EXPECT_EQ(direct_bytes, 0u);
    EXPECT_FALSE(still_direct);
  } else {
    EXPECT_TRUE(still_direct);
    EXPECT_EQ(direct_bytes, pages(b1, e1) + pages(b3, e3));
    EXPECT_GT(pages(b2, e2), 0u);  // it had whole pages, and wrote them through the cache
  }
  if (direct && !refused.empty()) GTEST_SKIP() << refused;
}

TEST(RawWriterDirect, SmallRunsSideBySideGoTogether) { SmallRunsTogether(true); }
TEST(RawWriter, SmallRunsSideBySideBuffered) { SmallRunsTogether(false); }

TEST(RawWriter, OpenNamesTheFile) {
  io::RawFile file;
  Status s = file.Open("/nonexistent-dir/data.h5", true);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("/nonexistent-dir/data.h5"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace mhckpt
