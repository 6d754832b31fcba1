// Device memory: save from GPU buffers that are freed right after Save, and
// restore into GPU buffers. Skipped (and reported as skipped) without a GPU.
// scripts/gpu-check.sh runs it on a machine that has one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "coordinator/checkpoint_manager.h"
#include "io/storage.h"
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

// Device memory holding `bytes` copied from `host`; freed by the caller.
void* ToDevice(const std::vector<std::byte>& host) {
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, host.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

std::vector<std::byte> FromDevice(const void* d, size_t bytes) {
  std::vector<std::byte> host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

void SleepOnStream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}

// Save is called while the caller's stream is still about to write the final
// values (a host function holds the stream for 300 ms, then a copy writes
// them): the snapshot must wait for that stream, not copy what is there now.
TEST(Gpu, SnapshotIsOrderedAfterTheCallersStream) {
  if (!internal::CudaAvailable()) GTEST_SKIP() << "no usable CUDA device";
  const int p = Size(), r = Rank();
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const std::vector<int64_t> shape{512 * p, 1024};
  auto [lo, hi] = SplitRange(shape[0], p, r);
  Box mine{{lo, 0}, {hi - lo, 1024}};
  auto final_values = Fill(DType::kFloat32, shape, mine, 5);
  std::vector<std::byte> zeros(final_values.size());
  void* d = ToDevice(zeros);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(stream, SleepOnStream, reinterpret_cast<void*>(intptr_t{300})),
            cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(d, final_values.data(), final_values.size(), cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, shape, {Shard{mine, d, Memory::kCuda, -1, stream}}}};
  ASSERT_TRUE(mgr->Save(1, arrays).ok());
  // Donated at once: overwritten on the stream, then freed.
  cudaMemsetAsync(d, 0xEE, final_values.size(), stream);
  cudaStreamSynchronize(stream);
  cudaFree(d);
  cudaStreamDestroy(stream);
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::byte> got(final_values.size());
  ArrayToRestore want{"w", DType::kFloat32, {Destination{mine, got.data()}}};
  s = mgr->Restore(1, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == final_values);
}

// A replicated array restored whole into every rank's GPU is read once (by
// rank 0) and broadcast: with NCCL where every rank has its own GPU (one rank
// here), through pinned host memory and MPI where ranks share one.
TEST(Gpu, ReplicatedArrayIsReadOnceIntoEveryGpu) {
  if (!internal::CudaAvailable()) GTEST_SKIP() << "no usable CUDA device";
  const int r = Rank();
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const std::vector<int64_t> shape{777, 129};
  auto values = Fill(DType::kBFloat16, shape, FullBox(shape), 9);
  std::vector<ArrayToSave> arrays{
      {"emb", DType::kBFloat16, shape, {Shard{FullBox(shape), values.data()}}}};
  ASSERT_TRUE(mgr->Save(1, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, values.size()), cudaSuccess);
  cudaMemset(d, 0, values.size());
  ArrayToRestore want{"emb", DType::kBFloat16, {Destination{FullBox(shape), d, Memory::kCuda}}};
  const uint64_t before = io::BytesRead();
  s = mgr->Restore(1, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(io::BytesRead() - before, r == 0 ? values.size() : 0u);
  EXPECT_TRUE(FromDevice(d, values.size()) == values);
  cudaFree(d);
}

// Saved from device buffers at one world size, restored into device buffers
// at another (ctest runs the save at 2 ranks, the restore at 3, all on one
// GPU). MHCKPT_GPU_PHASE says which half runs.
std::string ReshardDir() {
  const char* base = std::getenv("MHCKPT_TEST_DIR");
  return std::string(base != nullptr ? base : "/tmp") + "/gpu_reshard";
}

TEST(GpuReshard, SaveOrRestore) {
  const char* phase = std::getenv("MHCKPT_GPU_PHASE");
  if (phase == nullptr) GTEST_SKIP() << "runs as gpu.reshard.* (MHCKPT_GPU_PHASE)";
  if (!internal::CudaAvailable()) GTEST_SKIP() << "no usable CUDA device";
  const int p = Size(), r = Rank();
  const std::vector<int64_t> shape{1000, 3, 17};
  if (std::string(phase) == "save") {
    if (r == 0) std::filesystem::remove_all(ReshardDir());
    MPI_Barrier(MPI_COMM_WORLD);
    auto mgr = OpenForTest(ReshardDir());
    ASSERT_TRUE(mgr);
    auto [lo, hi] = SplitRange(shape[0], p, r);
    Box mine{{lo, 0, 0}, {hi - lo, 3, 17}};
    void* d = ToDevice(Fill(DType::kFloat16, shape, mine, 31));
    std::vector<ArrayToSave> arrays{{"x", DType::kFloat16, shape, {Shard{mine, d, Memory::kCuda}}}};
    ASSERT_TRUE(mgr->Save(7, arrays).ok());
    cudaFree(d);
    Status s = mgr->WaitUntilFinished();
    ASSERT_TRUE(s.ok()) << s.ToString();
    return;
  }
  auto mgr = OpenForTest(ReshardDir());
  ASSERT_TRUE(mgr);
  // Cut along the second dimension, which no saved box was.
  Box mine{{0, r % 3, 0}, {shape[0], 1, 17}};
  size_t bytes = static_cast<size_t>(shape[0]) * 17 * 2;
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
  ArrayToRestore want{"x", DType::kFloat16, {Destination{mine, d, Memory::kCuda}}};
  Status s = mgr->Restore(7, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(FromDevice(d, bytes) == Fill(DType::kFloat16, shape, mine, 31));
  cudaFree(d);
}

}  // namespace
}  // namespace mhckpt
