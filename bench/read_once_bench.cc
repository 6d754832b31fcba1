// mhckpt-read-once-bench: restores with and without RestoreOptions::read_once
// of a checkpoint whose boxes several ranks want (bench/run_read_once.sh).
//
//   mpirun -np 4 build/bin/mhckpt-read-once-bench --mib 1024 --reps 3 --dir D --drop-caches
//
// The save: 8 float32 arrays [rows, 4096], about --mib MiB together, laid out
// as tensor parallelism 2 x data parallelism np/2: rank r holds row half
// r % 2 of each array (so each half is held by np/2 ranks and written once).
// Then, per layout, --reps restores with read_once on and --reps with it off,
// interleaved rep by rep (on first, then off first, ...), so that a slow
// spell of the disk hits both:
//   tp2  every rank wants its half again (each half wanted by np/2 ranks)
//   dp   every rank wants both halves of every array (every rank the same
//        box set, as pure data parallelism over a sharded checkpoint)
// Each rep: the page cache dropped (--drop-caches), a barrier, Restore()
// into fresh memory; its figure is the slowest rank's time, and the bytes
// read from storage summed over the ranks (io::BytesRead). Every restore is
// verified. One line per (layout, read_once) on rank 0:
//   RESULT layout=tp2 np=4 read_once=1 reps=3 median_s=... min_s=... max_s=...
//          bytes_read=... wanted_bytes=... cache=dropped
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench/bench_util.h"
#include "bench/model.h"
#include "coordinator/checkpoint_manager.h"
#include "io/storage.h"
#include "programs/main_guard.h"

namespace mhckpt::bench {
namespace {

constexpr int kArrays = 8;
constexpr int64_t kCols = 4096;
constexpr uint64_t kRowBytes = kCols * 4;

int g_rank = 0, g_size = 1;

void Die(const Status& s, const char* what) {
  int bad = s.ok() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad == 0) return;
  if (!s.ok())
    fmt::print(stderr, "mhckpt-read-once-bench: rank {}: {}: {}\n", g_rank, what, s.ToString());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// Row half `h` of 2 of an array of `rows` rows.
Box Half(int64_t rows, int h) {
  auto [lo, hi] = SplitRange(rows, 2, h);
  return Box{{lo, 0}, {hi - lo, kCols}};
}

uint64_t BoxBytes(const Box& b) { return static_cast<uint64_t>(b.count[0]) * kRowBytes; }

uint64_t SumOverRanks(uint64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

struct Sample {
  double seconds = 0;
  uint64_t bytes_read = 0;  // summed over the ranks
  uint64_t wanted = 0;      // summed over the ranks
};

// One restore of every array, this rank wanting `halves` of each, into fresh
// memory; verified.
Sample RestoreOnce(CheckpointManager& mgr, int64_t rows, const std::vector<int>& halves,
                   bool read_once, bool drop) {
  std::vector<std::unique_ptr<std::byte[]>> buffers;
  std::vector<ArrayToRestore> arrays;
  uint64_t wanted = 0;
  for (int i = 0; i < kArrays; ++i) {
    ArrayToRestore a{fmt::format("w{}", i), DType::kFloat32, {}};
    for (int h : halves) {
      const Box b = Half(rows, h);
      buffers.emplace_back(new std::byte[BoxBytes(b)]);  // untouched, as a framework's new arrays
      a.shards.push_back(Destination{b, buffers.back().get()});
      wanted += BoxBytes(b);
    }
    arrays.push_back(std::move(a));
  }
  if (drop) DropCaches("3");
  RestoreOptions options;
  options.read_once = read_once;
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t before = io::BytesRead();
  auto t0 = Clock::now();
  Status s = mgr.Restore(1, arrays, options);
  const double dt = Since(t0);
  Die(s, "restore");
  Sample out{MaxOverRanks(dt), SumOverRanks(io::BytesRead() - before), SumOverRanks(wanted)};
  int bad = 0;
  for (const ArrayToRestore& a : arrays) {
    for (const Destination& d : a.shards) {
      bad += CheckFill(static_cast<const std::byte*>(d.data), BoxBytes(d.box), NameSeed(a.name),
                       static_cast<uint64_t>(d.box.start[0]) * kRowBytes)
                 ? 0
                 : 1;
    }
  }
  Die(bad == 0 ? OkStatus() : DataLoss(fmt::format("{} boxes differ", bad)), "verify");
  return out;
}

int Main(int argc, char** argv) {
  double mib = 1024;
  int reps = 3;
  std::string dir = "/var/tmp";
  bool drop = false;
  CLI::App app{"Restore with and without read_once of boxes wanted by several ranks"};
  app.add_option("--mib", mib, "Bytes of the checkpoint, MiB")->capture_default_str();
  app.add_option("--reps", reps, "Restores per (layout, read_once)")->capture_default_str();
  app.add_option("--dir", dir, "Parent of the checkpoint directory")->capture_default_str();
  app.add_flag("--drop-caches", drop, "Drop the page cache before each restore");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return g_rank == 0 ? app.exit(e) : e.get_exit_code();
  }
  // Rows a multiple of 128, so that each half is whole checksum chunks (1 MiB = 64 rows).
  const auto rows = std::max<int64_t>(
      128, static_cast<int64_t>(mib * 1024 * 1024 / kArrays / kRowBytes) / 128 * 128);
  long pid = g_rank == 0 ? static_cast<long>(getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::string root = fmt::format("{}/mhckpt-read-once-{}", dir, pid);

  Result<std::unique_ptr<CheckpointManager>> mgr = CheckpointManager::Open(MPI_COMM_WORLD, root);
  Die(mgr.status(), "open");
  {
    const int h = g_size >= 2 ? g_rank % 2 : -1;  // one rank: it holds both halves
    std::vector<std::unique_ptr<std::byte[]>> buffers;
    std::vector<ArrayToSave> arrays;
    for (int i = 0; i < kArrays; ++i) {
      const std::string name = fmt::format("w{}", i);
      ArrayToSave a{name, DType::kFloat32, {rows, kCols}, {}};
      for (int k : h < 0 ? std::vector<int>{0, 1} : std::vector<int>{h}) {
        const Box b = Half(rows, k);
        buffers.emplace_back(new std::byte[BoxBytes(b)]);
        Fill(buffers.back().get(), BoxBytes(b), NameSeed(name),
             static_cast<uint64_t>(b.start[0]) * kRowBytes);
        a.shards.push_back(Shard{b, buffers.back().get()});
      }
      arrays.push_back(std::move(a));
    }
    Die((*mgr)->Save(1, arrays), "save");
    Die((*mgr)->WaitUntilFinished(), "save");
  }
  const bool cold = drop && DropCaches("3");  // once: can the page cache be dropped here?
  for (const char* layout : {"tp2", "dp"}) {
    const std::vector<int> halves = std::string(layout) == "dp" || g_size < 2
                                        ? std::vector<int>{0, 1}
                                        : std::vector<int>{g_rank % 2};
    RestoreOnce(**mgr, rows, halves, true, false);  // warm-up (untimed)
    std::vector<double> on, off;
    uint64_t read_on = 0, read_off = 0, wanted = 0;
    for (int i = 0; i < reps; ++i) {
      // Which goes first alternates: a state one restore leaves (memory just
      // freed, the disk's own cache) falls on both alike.
      for (bool read_once : {i % 2 == 0, i % 2 != 0}) {
        Sample s = RestoreOnce(**mgr, rows, halves, read_once, drop);
        (read_once ? on : off).push_back(s.seconds);
        (read_once ? read_on : read_off) = s.bytes_read;
        wanted = s.wanted;
      }
    }
    if (g_rank == 0) {
      std::string load = LoadAverage();
      std::replace(load.begin(), load.end(), ' ', ',');
      for (bool read_once : {true, false}) {
        const std::vector<double>& v = read_once ? on : off;
        fmt::print(
            "RESULT layout={} np={} read_once={} reps={} median_s={:.3f} min_s={:.3f} "
            "max_s={:.3f} bytes_read={} wanted_bytes={} cache={} loadavg={}\n",
            layout, g_size, read_once ? 1 : 0, reps, Median(v),
            *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()),
            read_once ? read_on : read_off, wanted, cold ? "dropped" : "warm", load);
      }
    }
  }
  mgr->reset();
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) std::filesystem::remove_all(root);
  return 0;
}

}  // namespace
}  // namespace mhckpt::bench

int main(int argc, char** argv) {
  return mhckpt::GuardedMain("mhckpt-read-once-bench", [&] {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mhckpt::bench::g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mhckpt::bench::g_size);
    const int rc = mhckpt::bench::Main(argc, argv);
    MPI_Finalize();
    return rc;
  });
}
