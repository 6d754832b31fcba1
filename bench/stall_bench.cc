// mhckpt-stall-bench: what a save blocks a training loop for, the first time
// and every time, with the staging built ahead and with lazy saves.
//
//   mpirun -np 2 build/bin/mhckpt-stall-bench --mib 1024 --dir ROOT --json out.json
//
// One run measures, by medians over --reps samples, each sample the slowest
// rank's (a training loop's next collective waits for it):
//   memcpy       a plain memcpy of the rank's local bytes into touched memory;
//   first        the first Save of a fresh manager (fresh staging memory),
//                without and with Options::staging_reserve_bytes; with the
//                hint, Save comes --startup-s seconds after Open (the time a
//                job spends starting to train), without it as well;
//   blocking     a steady-state Save (staging touched, the previous save
//                committed);
//   lazy         a steady-state Save with CopyMode::kLazy: its stall, and the
//                fence time (Save's start to the end of the copy, from
//                SaveOptions::on_copied) while the caller runs a compute loop
//                calibrated to take as long as the memcpy alone, and how much
//                longer that loop takes than alone (the copy, then the save's
//                write, run beside it); the same loop right after a blocking
//                Save gives what the write alone costs it;
//   extra RSS    the peak resident memory over the run, less the model's
//                bytes and the memcpy target's, against the local bytes.
// Samples of blocking and lazy are interleaved, and a compute loop alone is
// timed in every sample, so that a slow spell falls on each alike.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_main.h"
#include "bench/bench_util.h"
#include "coordinator/checkpoint_manager.h"

namespace mhckpt::bench {
namespace {

using json = nlohmann::json;

struct Flags {
  double mib = 1024;  // all ranks together
  int reps = 5;
  double startup_s = 0;  // 0: 3 s per GiB of local bytes (this machine touches ~0.4 GiB/s)
  int lazy_threads = 0;  // Options::snapshot_threads for the lazy saves (0: the default)
  std::string dir = "mhckpt-stall-bench";
  std::string json;
};

constexpr int kArrays = 8;
constexpr int64_t kCols = 4096;  // float32: 16 KiB rows

// The rank's share of kArrays row-sharded float32 arrays, in touched memory.
class Model {
 public:
  explicit Model(double mib) {
    const auto total_rows =
        std::max<int64_t>(Size(), static_cast<int64_t>(mib * 1048576.0 / (kArrays * kCols * 4)));
    rows_ = total_rows / Size();
    shape_ = {rows_ * Size(), kCols};
    for (int i = 0; i < kArrays; ++i) {
      data_.emplace_back(static_cast<size_t>(rows_ * kCols));
      for (size_t k = 0; k < data_.back().size(); ++k) data_.back()[k] = float(k % 977) + i;
    }
  }
  [[nodiscard]] std::vector<ArrayToSave> Arrays() const {
    std::vector<ArrayToSave> out;
    for (int i = 0; i < kArrays; ++i) {
      out.push_back({fmt::format("w{}", i),
                     DType::kFloat32,
                     shape_,
                     {Shard{Box{{rows_ * Rank(), 0}, {rows_, kCols}}, data_[i].data()}}});
    }
    return out;
  }
  [[nodiscard]] size_t bytes() const { return size_t(kArrays) * rows_ * kCols * 4; }
  // memcpy of every array into `dst`.
  void CopyTo(std::byte* dst) const {
    for (const auto& a : data_) {
      std::memcpy(dst, a.data(), a.size() * 4);
      dst += a.size() * 4;
    }
  }

 private:
  int64_t rows_ = 0;
  std::vector<int64_t> shape_;
  std::vector<std::vector<float>> data_;
};

// A stand-in for a training step's compute: arithmetic on a buffer that
// stays in the core's cache, `iters` passes.
double Compute(int64_t iters) {
  static std::vector<float> v(16384, 1.0F);
  auto t0 = Clock::now();
  for (int64_t it = 0; it < iters; ++it) {
    for (float& x : v) x = x * 0.999F + 0.001F;
  }
  volatile float sink = v[static_cast<size_t>(iters) % v.size()];
  (void)sink;
  return Since(t0);
}

int64_t CalibrateCompute(double seconds) {
  int64_t iters = 16;
  while (Compute(iters) < 0.05) iters *= 2;
  return std::max<int64_t>(1, static_cast<int64_t>(iters * seconds / Compute(iters)));
}

struct Sample {
  double memcpy_s = 0, first_s = 0, first_hint_s = 0, blocking_s = 0, lazy_s = 0, fence_s = 0,
         compute_alone_s = 0, compute_during_s = 0, compute_blocking_s = 0;
};

class Bench {
 public:
  explicit Bench(const Flags& f) : f_(f), model_(f.mib), target_(model_.bytes()) {
    baseline_rss_ = ReadProcMemory().rss_bytes;
  }

  json Run() {
    const double local_gib = double(model_.bytes()) / double(1 << 30);
    const double startup = f_.startup_s > 0 ? f_.startup_s : std::max(1.0, 3.0 * local_gib);
    std::vector<Sample> samples(f_.reps);
    // 1. The first save, without and with the hint, alternating.
    for (int i = 0; i < f_.reps; ++i) {
      samples[i].first_s = FirstSave(false, startup, i);
      samples[i].first_hint_s = FirstSave(true, startup, i);
    }
    // 2. Steady state: one manager, one warm-up save of each kind.
    Options o;
    o.max_to_keep = 1;
    if (f_.lazy_threads > 0) o.snapshot_threads = f_.lazy_threads;
    auto opened = CheckpointManager::Open(MPI_COMM_WORLD, f_.dir + "/steady", o);
    Check(opened.status(), "open");
    auto mgr = std::move(opened).value();
    int64_t step = 0;
    TimedSave(*mgr, step++, false);
    TimedSave(*mgr, step++, true);
    ResetPeakRss();
    const double memcpy_alone = MaxOverRanks(TimedMemcpy());
    const int64_t iters = CalibrateCompute(memcpy_alone);
    for (int i = 0; i < f_.reps; ++i) {
      Sample& s = samples[i];
      s.memcpy_s = MaxOverRanks(TimedMemcpy());
      s.compute_alone_s = MaxOverRanks(Compute(iters));
      BlockingSave(*mgr, step++, iters, &s);
      LazySave(*mgr, step++, iters, &s);
    }
    const uint64_t peak = ReadProcMemory().hwm_bytes;
    const double extra = MaxOverRanks(double(peak) - double(baseline_rss_));
    mgr.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (Rank() == 0) std::filesystem::remove_all(f_.dir);

    auto med = [&](double Sample::*m) {
      std::vector<double> v;
      for (const Sample& s : samples) v.push_back(s.*m);
      return Median(v);
    };
    json r;
    r["local_bytes"] = model_.bytes();
    r["startup_s"] = startup;
    r["memcpy_s"] = med(&Sample::memcpy_s);
    r["first_s"] = med(&Sample::first_s);
    r["first_hint_s"] = med(&Sample::first_hint_s);
    r["blocking_s"] = med(&Sample::blocking_s);
    r["lazy_stall_s"] = med(&Sample::lazy_s);
    r["fence_s"] = med(&Sample::fence_s);
    r["compute_alone_s"] = med(&Sample::compute_alone_s);
    r["compute_during_s"] = med(&Sample::compute_during_s);
    r["compute_blocking_s"] = med(&Sample::compute_blocking_s);
    std::vector<double> slow, slow_blocking;
    for (const Sample& s : samples) {
      slow.push_back(s.compute_during_s / s.compute_alone_s);
      slow_blocking.push_back(s.compute_blocking_s / s.compute_alone_s);
    }
    r["compute_slowdown"] = Median(slow);
    r["compute_slowdown_blocking"] = Median(slow_blocking);
    const double mc = r["memcpy_s"].get<double>();
    r["first_vs_memcpy"] = r["first_s"].get<double>() / mc;
    r["first_hint_vs_memcpy"] = r["first_hint_s"].get<double>() / mc;
    r["blocking_vs_memcpy"] = r["blocking_s"].get<double>() / mc;
    r["lazy_stall_vs_memcpy"] = r["lazy_stall_s"].get<double>() / mc;
    r["fence_vs_memcpy"] = r["fence_s"].get<double>() / mc;
    r["extra_rss_bytes"] = extra;
    r["extra_rss_over_local_bytes"] = extra - double(model_.bytes());
    return r;
  }

 private:
  double TimedMemcpy() {
    auto t0 = Clock::now();
    model_.CopyTo(target_.data());
    return Since(t0);
  }

  // The stall of a fresh manager's first Save (slowest rank).
  double FirstSave(bool hint, double startup, int i) {
    Options o;
    if (hint) o.staging_reserve_bytes = model_.bytes();
    const std::string root = fmt::format("{}/first-{}-{}", f_.dir, hint ? "hint" : "plain", i);
    auto opened = CheckpointManager::Open(MPI_COMM_WORLD, root, o);
    Check(opened.status(), "open");
    auto mgr = std::move(opened).value();
    std::this_thread::sleep_for(std::chrono::duration<double>(startup));
    const double stall = MaxOverRanks(TimedSave(*mgr, 0, false));
    mgr.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (Rank() == 0) std::filesystem::remove_all(root);
    return stall;
  }

  // Save's wall time on this rank; waits until committed.
  static double TimedSaveOf(CheckpointManager& mgr, int64_t step, const std::vector<ArrayToSave>& a,
                            const SaveOptions& so) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    Check(mgr.Save(step, a, {}, so), "save");
    const double stall = Since(t0);
    Check(mgr.WaitUntilFinished(), "commit");
    return stall;
  }

  double TimedSave(CheckpointManager& mgr, int64_t step, bool lazy) {
    SaveOptions so;
    if (lazy) so.copy = CopyMode::kLazy;
    return TimedSaveOf(mgr, step, model_.Arrays(), so);
  }

  // A steady blocking save, then the compute loop while the save writes in
  // the background: what a loop sees of a save without the lazy copy.
  void BlockingSave(CheckpointManager& mgr, int64_t step, int64_t iters, Sample* s) {
    std::vector<ArrayToSave> a = model_.Arrays();
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    Check(mgr.Save(step, a), "save");
    const double stall = Since(t0);
    const double during = Compute(iters);
    Check(mgr.WaitUntilFinished(), "commit");
    s->blocking_s = MaxOverRanks(stall);
    s->compute_blocking_s = MaxOverRanks(during);
  }

  void LazySave(CheckpointManager& mgr, int64_t step, int64_t iters, Sample* s) {
    std::vector<ArrayToSave> a = model_.Arrays();
    std::atomic<int64_t> copied_ns{0};
    SaveOptions so;
    so.copy = CopyMode::kLazy;
    so.on_copied = [&copied_ns](const Status&) {
      copied_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
              .count();
    };
    SaveFence fence;
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    Check(mgr.Save(step, a, {}, so, &fence), "lazy save");
    const double stall = Since(t0);
    const double during = Compute(iters);
    Check(fence.Wait(), "fence");
    const double fence_s =
        double(
            copied_ns.load() -
            std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count()) *
        1e-9;
    Check(mgr.WaitUntilFinished(), "commit");
    s->lazy_s = MaxOverRanks(stall);
    s->fence_s = MaxOverRanks(fence_s);
    s->compute_during_s = MaxOverRanks(during);
  }

  Flags f_;
  Model model_;
  HugePageBuffer target_;
  uint64_t baseline_rss_ = 0;
};

}  // namespace
}  // namespace mhckpt::bench

int main(int argc, char** argv) {
  mhckpt::bench::Flags f;
  CLI::App app{"mhckpt-stall-bench: the first save, staging built ahead, and lazy saves"};
  app.add_option("--mib", f.mib, "checkpoint MiB, all ranks together");
  app.add_option("--reps", f.reps, "samples per figure (medians)");
  app.add_option("--startup-s", f.startup_s,
                 "seconds between Open and the first save (0: 3 per GiB of local bytes)");
  app.add_option("--lazy-threads", f.lazy_threads, "Options::snapshot_threads (0: the default)");
  app.add_option("--dir", f.dir, "checkpoint roots go below it (removed at the end)");
  app.add_option("--json", f.json, "write the figures here (rank 0)");
  return mhckpt::bench::BenchMain(argc, argv, app, &f.json, [&] {
    nlohmann::json out = mhckpt::bench::Bench(f).Run();
    out["mib"] = f.mib;
    out["reps"] = f.reps;
    out["lazy_threads"] = f.lazy_threads;
    return out;
  });
}
