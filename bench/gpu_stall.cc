// mhckpt-gpu-stall: how long Save holds training when the arrays live on the
// GPU, against the device's own limit measured in the same run — one
// cudaMemcpy of the same bytes into pinned host memory. Prints one JSON line:
//   {"bytes": ..., "d2h_s": median, "stall_s": median, "stall_over_d2h": ...}
// Run by scripts/gpu-check.sh; needs a GPU.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/bench_util.h"
#include "coordinator/checkpoint_manager.h"
#include "programs/main_guard.h"

namespace mhckpt::bench {
namespace {

int Run(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::stoul(argv[1]) : 1024;
  const std::string root = argc > 2 ? argv[2] : "/tmp/mhckpt-gpu-stall";
  const int reps = 5;
  const size_t bytes = mib << 20;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("skipped: no GPU");
    return 0;
  }
  cudaSetDevice(rank % devices);
  void* d = nullptr;
  void* pinned = nullptr;
  if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMallocHost(&pinned, bytes) != cudaSuccess) {
    std::fprintf(stderr, "mhckpt-gpu-stall: cannot allocate %zu MiB\n", mib);
    return 1;
  }
  cudaMemset(d, 0x5A, bytes);
  cudaDeviceSynchronize();

  std::vector<double> d2h, stall;
  for (int i = 0; i < reps + 1; ++i) {  // the first of each is a warm-up
    auto t0 = Clock::now();
    cudaMemcpy(pinned, d, bytes, cudaMemcpyDeviceToHost);
    if (i > 0) d2h.push_back(Since(t0));
  }
  if (rank == 0) std::filesystem::remove_all(root);
  MPI_Barrier(MPI_COMM_WORLD);
  Options o;
  o.max_to_keep = 1;
  auto mgr = CheckpointManager::Open(MPI_COMM_WORLD, root, o);
  if (!mgr.ok()) {
    std::fprintf(stderr, "mhckpt-gpu-stall: %s\n", mgr.status().ToString().c_str());
    return 1;
  }
  const auto rows = static_cast<int64_t>(bytes / 4096);
  const std::vector<int64_t> shape{rows * size, 1024};
  Box mine{{rows * rank, 0}, {rows, 1024}};
  std::vector<ArrayToSave> arrays{{"w", DType::kFloat32, shape, {Shard{mine, d, Memory::kCuda}}}};
  for (int i = 0; i < reps + 1; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    Status s = (*mgr)->Save(i, arrays);
    double t = Since(t0);
    if (s.ok()) s = (*mgr)->WaitUntilFinished();
    if (!s.ok()) {
      std::fprintf(stderr, "mhckpt-gpu-stall: %s\n", s.ToString().c_str());
      return 1;
    }
    if (i > 0) stall.push_back(t);
  }
  mgr->reset();
  cudaFree(d);
  cudaFreeHost(pinned);
  if (rank == 0) {
    double m_d2h = Median(d2h), m_stall = Median(stall);
    std::printf("%s\n", fmt::format(R"({{"ranks": {}, "bytes_per_rank": {}, "d2h_s": {:.4f}, )"
                                    R"("stall_s": {:.4f}, "stall_over_d2h": {:.3f}}})",
                                    size, bytes, m_d2h, m_stall, m_stall / m_d2h)
                            .c_str());
  }
  return 0;
}

}  // namespace
}  // namespace mhckpt::bench

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = mhckpt::GuardedMain("mhckpt-gpu-stall", [&] { return mhckpt::bench::Run(argc, argv); });
  MPI_Finalize();
  return rc;
}
