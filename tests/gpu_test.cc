// Device memory: save from GPU buffers that are freed right after Save, and
// restore into GPU buffers. Skipped (and reported as skipped) without a GPU.
// scripts/gpu-check.sh runs it on a machine that has one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>

#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"
#include "worker/copy.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::Size;

TEST(Gpu, SavedThenFreedDeviceBuffersRestoreBitExact) {
  if (!internal::CudaAvailable()) GTEST_SKIP() << "no usable CUDA device";
  const int p = Size(), r = Rank();
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const std::vector<int64_t> shape{1024 * p + 5, 256};
  auto [lo, hi] = SplitRange(shape[0], p, r);
  Box mine{{lo, 0}, {hi - lo, 256}};
  auto values = Fill(DType::kBFloat16, shape, mine, 77);
  auto bias = Fill(DType::kFloat32, {256}, FullBox({256}), 78);

  void* d_w = nullptr;
  void* d_b = nullptr;
  ASSERT_EQ(cudaMalloc(&d_w, values.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_b, bias.size()), cudaSuccess);
  cudaMemcpy(d_w, values.data(), values.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_b, bias.data(), bias.size(), cudaMemcpyHostToDevice);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kBFloat16, shape, {Shard{mine, d_w, Memory::kCuda}}},
      {"b", DType::kFloat32, {256}, {Shard{FullBox({256}), d_b, Memory::kCuda}}}};
  ASSERT_TRUE(mgr->Save(1, arrays).ok());
  cudaMemset(d_w, 0xEE, values.size());  // donated and reused at once
  cudaFree(d_w);
  cudaFree(d_b);
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();

  // Back into device memory, with another sharding.
  auto [lo2, hi2] = SplitRange(shape[0], p, p - 1 - r);
  Box theirs{{lo2, 0}, {hi2 - lo2, 256}};
  size_t bytes = static_cast<size_t>(*Volume(theirs.count)) * 2;
  void* d_out = nullptr;
  void* d_bias = nullptr;
  ASSERT_EQ(cudaMalloc(&d_out, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_bias, bias.size()), cudaSuccess);
  std::vector<ArrayToRestore> want{
      {"w", DType::kBFloat16, {Destination{theirs, d_out, Memory::kCuda}}},
      {"b", DType::kFloat32, {Destination{FullBox({256}), d_bias, Memory::kCuda}}}};
  s = mgr->Restore(1, want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::byte> got(bytes), got_bias(bias.size());
  cudaMemcpy(got.data(), d_out, bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(got_bias.data(), d_bias, bias.size(), cudaMemcpyDeviceToHost);
  EXPECT_TRUE(got == Fill(DType::kBFloat16, shape, theirs, 77));
  EXPECT_TRUE(got_bias == bias);
  cudaFree(d_out);
  cudaFree(d_bias);
}

}  // namespace
}  // namespace mhckpt
