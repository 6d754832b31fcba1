// worker/copy.h: threaded host copies; device copies without a device.
#include <gtest/gtest.h>

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
