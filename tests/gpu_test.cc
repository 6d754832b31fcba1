// Device memory: save from GPU buffers that are freed right after Save, and
// restore into GPU buffers; lazy saves of device buffers. Skipped (and reported as skipped) without
// a GPU. scripts/gpu-check.sh runs it on a machine that has one.
#include <cuda.h>  // types only
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "coordinator/device_broadcast.h"
#include "io/storage.h"
#include "tests/test_util.h"
#include "worker/copy.h"
#include "worker/staging_pool.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::Size;

// Each rank on its own GPU where there are enough (NCCL's path), else shared.
void UseThisRanksDevice() {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(Rank() % count), cudaSuccess);
}

#define MHCKPT_NEED_GPU()                                                    \
  do {                                                                       \
    if (!internal::CudaAvailable()) GTEST_SKIP() << "no usable CUDA device"; \
    UseThisRanksDevice();                                                    \
  } while (false)

TEST(Gpu, SavedThenFreedDeviceBuffersRestoreBitExact) {
  MHCKPT_NEED_GPU();
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
  // The device copies went into pinned staging (pageable memory would copy
  // slower, and silently).
  EXPECT_GT(mgr->StagingBytes(), 0u);
  EXPECT_EQ(mgr->PinnedStagingBytes(), mgr->StagingBytes());

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
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<const int*>(ms)));
}

// Holds `stream` for 500 ms (a host function): work queued behind it runs
// only then, long after any copy that does not wait for the stream.
void DelayStream(cudaStream_t stream) {
  static int delay_ms = 500;
  ASSERT_EQ(cudaLaunchHostFunc(stream, SleepOnStream, &delay_ms), cudaSuccess);
}

// Turns off mhckpt's wait for the caller's streams for one negative control.
class WithoutTheWait {
 public:
  WithoutTheWait() { internal::SetWaitForCallerStreamsForTest(false); }
  ~WithoutTheWait() { internal::SetWaitForCallerStreamsForTest(true); }
  WithoutTheWait(const WithoutTheWait&) = delete;
  WithoutTheWait& operator=(const WithoutTheWait&) = delete;
};

struct StreamOrderCase {
  std::vector<int64_t> shape;
  Box mine;
  size_t bytes;
};

StreamOrderCase OrderCase() {
  const int p = Size(), r = Rank();
  std::vector<int64_t> shape{512 * p, 1024};
  auto [lo, hi] = SplitRange(shape[0], p, r);
  Box mine{{lo, 0}, {hi - lo, 1024}};
  return {shape, mine, static_cast<size_t>(*Volume(mine.count)) * 4};
}

// The bytes Save took from a zeroed device buffer whose caller stream is
// still to set every byte to 0x5A (a cudaMemsetAsync queued behind a 500 ms
// host function): all 0x5A if the snapshot waited for the stream, zeros if not.
std::vector<std::byte> SavedWhileTheStreamWrites() {
  StreamOrderCase c = OrderCase();
  auto mgr = OpenForTest(FreshDir());
  EXPECT_TRUE(mgr);
  if (!mgr) return {};
  void* d = ToDevice(std::vector<std::byte>(c.bytes));
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DelayStream(stream);
  EXPECT_EQ(cudaMemsetAsync(d, 0x5A, c.bytes, stream), cudaSuccess);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, c.shape, {Shard{c.mine, d, Memory::kCuda, -1, stream}}}};
  Status s = mgr->Save(1, arrays);
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Donated at once: overwritten on the stream, then freed.
  EXPECT_EQ(cudaMemsetAsync(d, 0xEE, c.bytes, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaFree(d);
  cudaStreamDestroy(stream);
  s = mgr->WaitUntilFinished();
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<std::byte> got(c.bytes);
  ArrayToRestore want{"w", DType::kFloat32, {Destination{c.mine, got.data()}}};
  s = mgr->Restore(1, {&want, 1});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return got;
}

// Save is called while the caller's stream is still to write the final
// values: the snapshot must wait for that stream, not copy what is there now.
TEST(Gpu, SaveWaitsForTheCallersStream) {
  MHCKPT_NEED_GPU();
  EXPECT_TRUE(SavedWhileTheStreamWrites() ==
              std::vector<std::byte>(OrderCase().bytes, std::byte{0x5A}));
}

// Negative control: without the wait, the same save copies the old zeros, so
// the test above can fail.
TEST(Gpu, SaveWithoutTheWaitCopiesTheOldBytes) {
  MHCKPT_NEED_GPU();
  WithoutTheWait off;
  EXPECT_FALSE(SavedWhileTheStreamWrites() ==
               std::vector<std::byte>(OrderCase().bytes, std::byte{0x5A}));
}

// The device bytes after a restore of known values into a buffer whose caller
// stream still has a cudaMemsetAsync(0xEE) queued behind a 500 ms host
// function: the saved values if the copies waited for the stream, 0xEE if they
// landed first and the memset overwrote them.
// `per_thread`: the caller's stream is its cudaStreamPerThread, which names
// another stream on mhckpt's I/O thread, where the copies run.
std::vector<std::byte> RestoredWhileTheStreamWrites(std::vector<std::byte>* expected,
                                                    bool per_thread = false) {
  StreamOrderCase c = OrderCase();
  *expected = Fill(DType::kFloat32, c.shape, c.mine, 41);
  auto mgr = OpenForTest(FreshDir());
  EXPECT_TRUE(mgr);
  if (!mgr) return {};
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, c.shape, {Shard{c.mine, expected->data()}}}};
  EXPECT_TRUE(mgr->Save(1, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  EXPECT_TRUE(s.ok()) << s.ToString();
  void* d = ToDevice(std::vector<std::byte>(c.bytes));
  cudaStream_t stream = cudaStreamPerThread;
  if (!per_thread)
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DelayStream(stream);
  EXPECT_EQ(cudaMemsetAsync(d, 0xEE, c.bytes, stream), cudaSuccess);  // the model still writes
  ArrayToRestore want{"w", DType::kFloat32, {Destination{c.mine, d, Memory::kCuda, -1, stream}}};
  s = mgr->Restore(1, {&want, 1});
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<std::byte> got = FromDevice(d, c.bytes);
  cudaFree(d);
  if (!per_thread) cudaStreamDestroy(stream);
  return got;
}

TEST(Gpu, RestoreWaitsForTheCallersStream) {
  MHCKPT_NEED_GPU();
  std::vector<std::byte> expected;
  EXPECT_TRUE(RestoredWhileTheStreamWrites(&expected) == expected);
}

// Negative control: without the wait, the queued memset lands after the
// restored bytes and overwrites them, so the test above can fail.
TEST(Gpu, RestoreWithoutTheWaitIsOverwritten) {
  MHCKPT_NEED_GPU();
  WithoutTheWait off;
  std::vector<std::byte> expected;
  EXPECT_FALSE(RestoredWhileTheStreamWrites(&expected) == expected);
}

// Restore is called from a thread whose cudaStreamPerThread still writes the
// destination; the copies run on the I/O thread, whose cudaStreamPerThread
// is another stream. Restore resolves the stream on the calling thread: the
// restored bytes land after the queued memset, and win.
TEST(Gpu, RestoreWaitsForTheCallersPerThreadStream) {
  MHCKPT_NEED_GPU();
  std::vector<std::byte> expected;
  EXPECT_TRUE(RestoredWhileTheStreamWrites(&expected, /*per_thread=*/true) == expected);
}

// Negative control: with cudaStreamPerThread left for the I/O thread to
// resolve, the copies wait for that thread's own (idle) stream, land before
// the caller's memset and are overwritten, so the test above can fail.
TEST(Gpu, RestoreWithThePerThreadStreamResolvedOnTheIoThreadIsOverwritten) {
  MHCKPT_NEED_GPU();
  internal::SetResolveCallerStreamsForTest(false);
  std::vector<std::byte> expected;
  std::vector<std::byte> got = RestoredWhileTheStreamWrites(&expected, /*per_thread=*/true);
  internal::SetResolveCallerStreamsForTest(true);
  EXPECT_FALSE(got == expected);
}

// Staging memory lent by a pool with mhckpt's hooks is page-locked for
// CUDA, and the pool says so.
TEST(Gpu, PinnedStagingIsPageLockedForCuda) {
  MHCKPT_NEED_GPU();
  internal::StagingPool pool(size_t{8} << 20);
  pool.SetHooks(internal::PinHostMemory, internal::UnpinHostMemory);
  auto b = pool.Acquire(size_t{1} << 20);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(b->pinned());
  EXPECT_EQ(pool.pinned_bytes(), pool.allocated_bytes());
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, b->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
}

// A buffer whose pinning failed (here: refused once by the hook, as CUDA
// may refuse) is not reported pinned, is not registered with CUDA, and is
// pinned at its next use.
TEST(Gpu, StagingNotPinnedAtFirstIsPinnedAtItsNextUse) {
  MHCKPT_NEED_GPU();
  int tries = 0;
  internal::StagingPool pool(size_t{8} << 20);
  pool.SetHooks([&](void* p, size_t n) { return ++tries > 1 && internal::PinHostMemory(p, n); },
                internal::UnpinHostMemory);
  std::byte* data = nullptr;
  {
    auto b = pool.Acquire(size_t{1} << 20);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_FALSE(b->pinned());
    data = b->data();
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, data), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);
  }
  auto b = pool.Acquire(size_t{1} << 20);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->data(), data);
  EXPECT_TRUE(b->pinned());
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, data), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
}

// Lazy saves of device memory: Save records an event on the caller's stream
// and returns; the copy runs on mhckpt's streams behind that event, and the
// fence completes once it has.

SaveOptions Lazy() {
  SaveOptions so;
  so.copy = CopyMode::kLazy;
  return so;
}

// The caller stream of a lazy-save test: a stream of its own, or (nullptr)
// the legacy default stream.
class CallerStream {
 public:
  explicit CallerStream(bool own) {
    if (own) EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  ~CallerStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  CallerStream(const CallerStream&) = delete;
  CallerStream& operator=(const CallerStream&) = delete;
  [[nodiscard]] cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Restores array "w" of `step` into host memory.
std::vector<std::byte> RestoreToHost(CheckpointManager& mgr, int64_t step,
                                     const StreamOrderCase& c) {
  std::vector<std::byte> got(c.bytes);
  ArrayToRestore want{"w", DType::kFloat32, {Destination{c.mine, got.data()}}};
  Status s = mgr.Restore(step, {&want, 1});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return got;
}

// Saved lazily from a device buffer of known values; the caller waits on the
// fence, then overwrites the buffer on its stream (a cudaMemsetAsync) and
// frees it: the step holds the values of the fence.
void LazySaveThenOverwriteAfterTheFence(bool own_stream) {
  StreamOrderCase c = OrderCase();
  const std::vector<std::byte> values = Fill(DType::kFloat32, c.shape, c.mine, 53);
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  CallerStream stream(own_stream);
  void* d = ToDevice(values);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, c.shape, {Shard{c.mine, d, Memory::kCuda, -1, stream.get()}}}};
  SaveFence fence;
  Status s = mgr->Save(1, arrays, {}, Lazy(), &fence);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = fence.Wait();
  EXPECT_TRUE(s.ok()) << s.ToString();
  // The fence has completed: the buffer is the caller's again.
  EXPECT_EQ(cudaMemsetAsync(d, 0xEE, c.bytes, stream.get()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  cudaFree(d);
  s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(RestoreToHost(*mgr, 1, c) == values);
}

TEST(GpuLazy, OverwrittenAfterTheFenceRestoresTheSavedBytes) {
  MHCKPT_NEED_GPU();
  LazySaveThenOverwriteAfterTheFence(true);
}

TEST(GpuLazy, OverwrittenAfterTheFenceOnTheLegacyDefaultStream) {
  MHCKPT_NEED_GPU();
  LazySaveThenOverwriteAfterTheFence(false);
}

// A zeroed device buffer whose caller stream, held 500 ms by a host
// function, still has a cudaMemsetAsync(0x5A) queued when Save is called
// lazily. `returned_before_copy` is set to whether the fence was still open
// when Save returned (the copy waits for the held stream, so a Save that
// waited for the copy returns after it). The restored bytes: all 0x5A if the
// copy waited for the work queued before Save, zeros if not.
std::vector<std::byte> LazySavedWhileTheStreamWrites(bool own_stream, bool* returned_before_copy) {
  StreamOrderCase c = OrderCase();
  *returned_before_copy = false;
  auto mgr = OpenForTest(FreshDir());
  EXPECT_TRUE(mgr);
  if (!mgr) return {};
  CallerStream stream(own_stream);
  void* d = ToDevice(std::vector<std::byte>(c.bytes));
  DelayStream(stream.get());
  EXPECT_EQ(cudaMemsetAsync(d, 0x5A, c.bytes, stream.get()), cudaSuccess);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, c.shape, {Shard{c.mine, d, Memory::kCuda, -1, stream.get()}}}};
  SaveFence fence;
  Status s = mgr->Save(1, arrays, {}, Lazy(), &fence);
  *returned_before_copy = !fence.Done();
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = fence.Wait();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  cudaFree(d);
  s = mgr->WaitUntilFinished();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return RestoreToHost(*mgr, 1, c);
}

TEST(GpuLazy, CopyWaitsForTheCallersStreamAndSaveDoesNot) {
  MHCKPT_NEED_GPU();
  bool returned_before_copy = false;
  EXPECT_TRUE(LazySavedWhileTheStreamWrites(true, &returned_before_copy) ==
              std::vector<std::byte>(OrderCase().bytes, std::byte{0x5A}));
  EXPECT_TRUE(returned_before_copy) << "Save waited for the device copy";
}

TEST(GpuLazy, CopyWaitsForTheLegacyDefaultStream) {
  MHCKPT_NEED_GPU();
  bool returned_before_copy = false;
  EXPECT_TRUE(LazySavedWhileTheStreamWrites(false, &returned_before_copy) ==
              std::vector<std::byte>(OrderCase().bytes, std::byte{0x5A}));
  EXPECT_TRUE(returned_before_copy) << "Save waited for the device copy";
}

// Negative control: without the event on the caller's stream, the lazy copy
// takes the old zeros, so the tests above can fail.
TEST(GpuLazy, CopyWithoutTheWaitTakesTheOldBytes) {
  MHCKPT_NEED_GPU();
  WithoutTheWait off;
  bool returned_before_copy = false;
  EXPECT_FALSE(LazySavedWhileTheStreamWrites(true, &returned_before_copy) ==
               std::vector<std::byte>(OrderCase().bytes, std::byte{0x5A}));
}

// Host memory passed as device memory: the lazy save's CUDA error names the
// array, the rank and the box, is returned by Save, and fails the save on
// every rank.
TEST(GpuLazy, CudaErrorNamesTheArrayTheRankAndTheBox) {
  MHCKPT_NEED_GPU();
  StreamOrderCase c = OrderCase();
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  std::vector<std::byte> host(c.bytes);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, c.shape, {Shard{c.mine, host.data(), Memory::kCuda}}}};
  SaveFence fence;
  Status s = mgr->Save(1, arrays, {}, Lazy(), &fence);
  EXPECT_FALSE(s.ok());
  const std::string where =
      "rank " + std::to_string(Rank()) + ": array 'w', box " + BoxToString(c.mine);
  EXPECT_NE(s.message().find(where), std::string::npos) << s.ToString();
  EXPECT_TRUE(fence.Wait().ok());  // nothing left to copy
  Status all = mgr->WaitUntilFinished();
  EXPECT_FALSE(all.ok());
  EXPECT_TRUE(testing::SameOnAllRanks(all)) << all.ToString();
  auto steps = mgr->CommittedSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty());
}

// A replicated array restored whole into every rank's GPU is read once (by
// rank 0) and broadcast: with NCCL where every rank has its own GPU (one rank
// here), through pinned host memory and MPI where ranks share one.
TEST(Gpu, ReplicatedArrayIsReadOnceIntoEveryGpu) {
  MHCKPT_NEED_GPU();
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

// NCCL's deadline is a share of the watchdog's timeout, so that a hung
// broadcast ends in an agreed error before the watchdog's MPI_Abort.
TEST(GpuNccl, DeadlineIsHalfTheWatchdogsTimeout) {
  EXPECT_EQ(internal::NcclDeadlineSeconds(8), 4);
  EXPECT_LT(internal::NcclDeadlineSeconds(3600), 3600);
  EXPECT_EQ(internal::NcclDeadlineSeconds(0), 0);  // no watchdog: no deadline
}

// A replicated array restored whole into every rank's GPU (NCCL's path) while
// the last rank's enqueue of the broadcast fails (fault point nccl_enqueue).
// Returns the restore's outcome; `seconds` gets the longest restore over the
// ranks, `skip` why NCCL did not serve it (then nothing else is meaningful).
// The watchdog's timeout is 8 s, NCCL's deadline 4 s.
Status RestoreWithARefusedEnqueue(double* seconds, std::string* skip) {
  constexpr double kWatchdog = 8;
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (Size() < 2 || count < Size()) {
    *skip = "needs two ranks, each on a GPU of its own (NCCL refuses a shared one)";
    return OkStatus();
  }
  Options o;
  o.collective_timeout_seconds = kWatchdog;
  auto mgr = OpenForTest(FreshDir(), o);
  EXPECT_TRUE(mgr);
  if (!mgr) return Internal("no manager");
  const std::vector<int64_t> shape{4096, 1024};  // 16 MiB: the root blocks on a missing peer
  auto values = Fill(DType::kFloat32, shape, FullBox(shape), 5);
  std::vector<ArrayToSave> arrays{
      {"emb", DType::kFloat32, shape, {Shard{FullBox(shape), values.data()}}}};
  EXPECT_TRUE(mgr->Save(1, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  EXPECT_TRUE(s.ok()) << s.ToString();
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, values.size()), cudaSuccess);
  EXPECT_TRUE(
      fault::Configure("rank=" + std::to_string(Size() - 1) + ",point=nccl_enqueue,action=eio")
          .ok());
  ArrayToRestore want{"emb", DType::kFloat32, {Destination{FullBox(shape), d, Memory::kCuda}}};
  const auto start = std::chrono::steady_clock::now();
  s = mgr->Restore(1, {&want, 1});
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t fired = fault::Fired();
  EXPECT_TRUE(fault::Configure("").ok());
  cudaFree(d);
  MPI_Allreduce(&mine, seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (testing::SumOverRanks(static_cast<uint64_t>(fired)) == 0) {
    *skip = "NCCL did not serve the restore (not built, or its init failed)";
  }
  return s;
}

// Fixed: every rank learns of the failed enqueue before it waits, aborts its
// communicator and fails at once, with the same error; nobody waits for
// NCCL's deadline, and the watchdog does not abort the job.
TEST(GpuNccl, AFailedEnqueueOnOneRankFailsEveryRankAtOnce) {
  MHCKPT_NEED_GPU();
  double seconds = 0;
  std::string skip;
  Status s = RestoreWithARefusedEnqueue(&seconds, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(testing::SameOnAllRanks(s)) << s.ToString();
  EXPECT_LT(seconds, internal::NcclDeadlineSeconds(8)) << "a rank waited for NCCL's deadline";
}

// Negative control: without the agreement after the enqueue, the ranks that
// queued the broadcast wait inside it for the rank that never joins, until
// NCCL's deadline (4 s). The restore still fails with an agreed error, not
// the watchdog's MPI_Abort (8 s): the deadline is half its timeout.
TEST(GpuNccl, WithoutTheAgreementTheOthersWaitForTheDeadline) {
  MHCKPT_NEED_GPU();
  internal::SetAgreeBroadcastEnqueueForTest(false);
  double seconds = 0;
  std::string skip;
  Status s = RestoreWithARefusedEnqueue(&seconds, &skip);
  internal::SetAgreeBroadcastEnqueueForTest(true);
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(testing::SameOnAllRanks(s)) << s.ToString();
  EXPECT_GE(seconds, 0.9 * internal::NcclDeadlineSeconds(8));
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
  MHCKPT_NEED_GPU();
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

// Whether device `device` has an active primary context, through the driver
// (reached through the runtime, as mhckpt does); nullopt if it cannot tell.
std::optional<bool> PrimaryContextActive(int device) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return std::nullopt;
  }
  unsigned flags = 0;
  int active = 0;
  auto get = reinterpret_cast<CUresult (*)(CUdevice, unsigned*, int*)>(fn);
  if (get(device, &flags, &active) != CUDA_SUCCESS) return std::nullopt;
  return active != 0;
}

// Saved from and restored into device 1 (its I/O thread pins, allocates and
// copies): no context appears on device 0, which mhckpt was not asked to use.
// Runs alone in its process (gpu.contexts): any other test touches device 0.
TEST(GpuContexts, NoContextOnADeviceNotAskedFor) {
  if (std::getenv("MHCKPT_GPU_CONTEXTS") == nullptr) GTEST_SKIP() << "runs as gpu.contexts";
  if (!internal::CudaAvailable()) GTEST_SKIP() << "no usable CUDA device";
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs two GPUs";
  std::optional<bool> before = PrimaryContextActive(0);
  if (!before) GTEST_SKIP() << "the driver cannot tell whether device 0 has a context";
  ASSERT_FALSE(*before) << "device 0 had a context before mhckpt ran (MPI's CUDA support?)";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const std::vector<int64_t> shape{256, 1024};
  auto values = Fill(DType::kFloat32, shape, FullBox(shape), 3);
  void* d = ToDevice(values);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, shape, {Shard{FullBox(shape), d, Memory::kCuda}}}};
  ASSERT_TRUE(mgr->Save(1, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(cudaMemset(d, 0, values.size()), cudaSuccess);
  ArrayToRestore want{"w", DType::kFloat32, {Destination{FullBox(shape), d, Memory::kCuda}}};
  s = mgr->Restore(1, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(FromDevice(d, values.size()) == values);
  cudaFree(d);
  mgr.reset();
  EXPECT_EQ(PrimaryContextActive(0), std::optional<bool>(false));
}

}  // namespace
}  // namespace mhckpt
