// worker/copy.h: threaded host copies; device copies without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

TEST(ParallelCopy, CopiesEveryByteWithManyThreads) {
  std::vector<std::vector<char>> src, dst;
  std::vector<CopyTask> tasks;
  for (size_t n : {size_t{1}, size_t{40} << 20, size_t{4097}, size_t{0}, size_t{7} << 20}) {
    src.emplace_back(n);
    for (size_t i = 0; i < n; ++i) src.back()[i] = static_cast<char>(i * 131 + n);
    dst.emplace_back(n, 0);
  }
  for (size_t i = 0; i < src.size(); ++i)
    tasks.push_back({dst[i].data(), src[i].data(), src[i].size()});
  ParallelCopy(tasks, 3);
  EXPECT_TRUE(src == dst);
}

// Every length from 0 to a few streaming blocks, at every alignment of
// either side: the bytes land, and nothing beyond them is written.
TEST(CopyUncached, CopiesEveryLengthAtEveryAlignment) {
  std::vector<std::byte> src(512), dst(512);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
  for (size_t s = 0; s < 16; ++s) {
    for (size_t d = 0; d < 16; ++d) {
      for (size_t n = 0; n + 32 < src.size(); n += (n < 80 ? 1 : 37)) {
        std::fill(dst.begin(), dst.end(), std::byte{0});
        CopyUncached(dst.data() + d, src.data() + s, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const std::byte want = i >= d && i < d + n ? src[s + i - d] : std::byte{0};
          ASSERT_EQ(dst[i], want) << "source +" << s << ", destination +" << d << ", " << n
                                  << " bytes: byte " << i;
        }
      }
    }
  }
}

TEST(Cuda, AbsentDeviceIsReportedNotFatal) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  char host[8] = {};
  CopyTask t{host, host, 8};
  EXPECT_EQ(CopyDeviceToHost({&t, 1}).code(), StatusCode::kFailedPrecondition);
}

// A lazy save's halves without a device: refused, naming no task; an empty
// mark is harmless to reset and destroy.
TEST(Cuda, LazyHalvesWithoutADeviceAreRefused) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  char host[8] = {};
  CopyTask t{host, host, 8};
  CallerStreamMark mark;
  std::optional<size_t> failed;
  EXPECT_EQ(MarkCallerStreams({&t, 1}, &mark, &failed).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(failed.has_value());
  EXPECT_TRUE(mark.entries().empty());
  EXPECT_EQ(CopyDeviceToHostAfter({&t, 1}, mark, &failed).code(), StatusCode::kFailedPrecondition);
  CallerStreamMark moved(std::move(mark));
  moved.Reset();
  EXPECT_TRUE(moved.entries().empty());
}

}  // namespace
}  // namespace mhckpt::internal
