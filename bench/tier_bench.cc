// mhckpt-tier-bench: the local tier against the machine's own limits and
// against the shared root, in one run (docs/PERFORMANCE.md, "Two tiers"):
//
//   mpirun -np 4 build/bin/mhckpt-tier-bench --mib 1024 --ranks-per-node 2
//       --dir /var/tmp/tier --local /dev/shm/mhckpt-tier --reps 5 --json tier.json
//
// Nodes are simulated by Options::node_id (--ranks-per-node ranks each), each
// with its own local dir LOCAL/node<N>. Each rank holds --mib MiB of one
// sharded array. Figures, each the maximum over the ranks per rep, then the
// median over the reps:
//   baseline    a memcpy of the rank's bytes into touched memory, plus an MPI
//               send of the same bytes to the rank that keeps its copy (the
//               next node, same position): the least a local commit can cost
//   local       Save to WaitUntilFinished of a local-only save, once the
//               local tier recycles a dropped step's pages (the steady state
//               of saving every step); local_first: the first saves, which
//               size new files; local_phase: the part of it after the
//               snapshot, on the I/O thread (SaveTimings::local: the file
//               moved into the step, the copy sent and received, the marker)
//   stall_one / stall_two
//               the time Save blocks, one tier (shared root only) against two
//               tiers (every save to both)
//   restart     Open, then Restore of the newest step from the local tier by
//               a new manager with every node's local dir intact, into fresh
//               memory (new arrays, MADV_HUGEPAGE as numpy's): a restart of
//               the processes after a crash, the nodes' memory kept; set
//               against a memcpy of the rank's bytes into fresh memory of the
//               same kind (the least it can cost), and the touched-memory one
//   recovery    after the last node's local dir is removed (the node is lost,
//               a fresh one replaces it): Open, then Restore of the newest step
//               from the survivors' files and copies, into fresh memory; set
//               against its limit, the fresh memcpy plus the MPI send
//   cold        Restore of the same step from the shared root into fresh
//               memory, page cache dropped (Open apart)
// Every restore is checked byte for byte against what was saved; a mismatch
// exits non-zero.
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_main.h"
#include "bench/bench_util.h"
#include "coordinator/checkpoint_manager.h"

namespace mhckpt::bench {
namespace {

struct Flags {
  int mib = 256;
  int ranks_per_node = 1;
  int reps = 3;
  std::string dir = "/var/tmp/mhckpt-tier-bench";
  std::string local = "/dev/shm/mhckpt-tier-bench";
  std::string json;
  bool prefault = true;  // RestoreOptions::prefault
};

class Bench {
 public:
  explicit Bench(const Flags& f)
      : f_(f),
        rows_(int64_t{f.mib} << 20 >> 12),  // rows of 4 KiB
        data_(static_cast<size_t>(rows_) << 12),
        scratch_(data_.size()) {
    shape_ = {rows_ * Size(), 4096};
    box_ = Box{{rows_ * Rank(), 0}, {rows_, 4096}};
    for (size_t i = 0; i < data_.size(); i += 8) {
      const uint64_t v = (i / 8) * 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(Rank());
      std::memcpy(data_.data() + i, &v, 8);
    }
    std::memset(scratch_.data(), 1, scratch_.size());
  }

  nlohmann::json Run() {
    nlohmann::json out;
    out["baseline_memcpy_s"] = Median(Repeat([&] { Memcpy(); }));
    out["fresh_memcpy_s"] = Median(FreshMemcpy());
    out["baseline_send_s"] = Median(Repeat([&] { SendToCopyHolder(); }));
    out["baseline_s"] =
        out["baseline_memcpy_s"].get<double>() + out["baseline_send_s"].get<double>();

    Clean();
    {
      auto one = Open(false);
      Save(*one, 0, SaveTier::kAuto);  // warm-up: first touch of staging
      std::vector<double> stall;
      for (int r = 0; r < f_.reps; ++r) stall.push_back(Save(*one, 1 + r, SaveTier::kAuto).first);
      out["stall_one_s"] = Median(stall);
    }
    Clean();
    std::vector<double> stall, local, local_phase, local_first, restart, restart_open, recovery,
        open, cold;
    int64_t step = 0;
    {
      auto two = Open(true);
      Save(*two, step++, SaveTier::kPersistent);  // warm-up
      for (int r = 0; r < f_.reps; ++r)
        stall.push_back(Save(*two, step++, SaveTier::kPersistent).first);
      // The first local saves find no pages to recycle: each sizes a new
      // file in the local dir (posix_fallocate of the rank's bytes, then its
      // mapping's faults). From the save after local_max_to_keep + 1 on, a
      // dropped step's files come back as the landing file and as the step's
      // directory: the steady state of a loop that saves every step.
      const int until_warm = Options{}.local_max_to_keep + 2;
      for (int r = 0; r < until_warm; ++r) {
        const double commit = Save(*two, step++, SaveTier::kLocal).second;
        if (r < f_.reps) local_first.push_back(commit);
      }
      for (int r = 0; r < f_.reps; ++r) {
        local.push_back(Save(*two, step++, SaveTier::kLocal).second);
        local_phase.push_back(MaxOverRanks(two->LastSaveTimings().local));
      }
    }
    // Recovery needs a second node to keep the lost one's copies.
    const bool recovery_too = Size() > f_.ranks_per_node;
    for (int r = 0; r < f_.reps; ++r) {
      const int64_t saved = step++;
      {
        auto two = Open(true);
        Save(*two, saved, SaveTier::kPersistent);
      }
      {
        // Every rank's old manager is gone first: its destructor waits for
        // the retention it started (a crashed process's would not run), and
        // a rank done early would count that wait in its Open.
        MPI_Barrier(MPI_COMM_WORLD);
        auto t0 = Clock::now();
        auto two = OpenWithLocalStep(saved, "the restart");
        restart_open.push_back(MaxOverRanks(Since(t0)));
        restart.push_back(Restore(*two, saved, RestoreSource::kLocal, /*fresh=*/true));
      }
      if (recovery_too) LoseLastNode();
      auto t0 = Clock::now();
      auto two = OpenWithLocalStep(saved, "the node loss");
      if (recovery_too) {
        open.push_back(MaxOverRanks(Since(t0)));
        recovery.push_back(Restore(*two, saved, RestoreSource::kLocal, /*fresh=*/true));
      }
      if (!DropCaches()) Fail("cannot drop the page cache (needs root)");
      cold.push_back(Restore(*two, saved, RestoreSource::kPersistent, /*fresh=*/true));
    }
    out["restart_open_s"] = Median(restart_open);
    out["restart_restore_s"] = Median(restart);
    out["restart_vs_fresh_memcpy"] = Median(restart) / out["fresh_memcpy_s"].get<double>();
    out["restart_vs_memcpy"] = Median(restart) / out["baseline_memcpy_s"].get<double>();
    out["stall_two_s"] = Median(stall);
    out["local_commit_s"] = Median(local);
    out["local_commit_first_s"] = Median(local_first);
    out["local_phase_s"] = Median(local_phase);
    out["recovery_open_s"] = Median(open);
    out["recovery_restore_s"] = Median(recovery);
    out["cold_restore_s"] = Median(cold);
    out["local_vs_baseline"] = Median(local) / out["baseline_s"].get<double>();
    out["local_first_vs_baseline"] = Median(local_first) / out["baseline_s"].get<double>();
    out["stall_two_vs_one"] = Median(stall) / out["stall_one_s"].get<double>();
    if (recovery_too) {
      out["cold_vs_recovery"] = Median(cold) / Median(recovery);
      // Its limit: each rank's bytes copied into fresh memory, and the lost
      // node's sent to its replacement.
      out["recovery_vs_limit"] = Median(recovery) / (out["fresh_memcpy_s"].get<double>() +
                                                     out["baseline_send_s"].get<double>());
    }
    Clean();
    return out;
  }

 private:
  template <typename F>
  std::vector<double> Repeat(F&& f) {
    std::vector<double> t;
    for (int r = 0; r < f_.reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      f();
      t.push_back(MaxOverRanks(Since(t0)));
    }
    return t;
  }

  void Memcpy() { std::memcpy(scratch_.data(), data_.data(), data_.size()); }

  // A memcpy of the rank's bytes into fresh memory (mapped before the clock
  // starts, unmapped after it stops), each rep the slowest rank's.
  std::vector<double> FreshMemcpy() {
    std::vector<double> t;
    for (int r = 0; r < f_.reps; ++r) {
      HugePageBuffer fresh(data_.size(), /*touch=*/false);
      if (fresh.data() == nullptr) Fail("cannot map fresh memory");
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      std::memcpy(fresh.data(), data_.data(), data_.size());
      t.push_back(MaxOverRanks(Since(t0)));
    }
    return t;
  }

  // The rank that keeps this rank's copy: the same position on the next node.
  int CopyHolder(int rank) const { return (rank + f_.ranks_per_node) % Size(); }
  int CopySender(int rank) const { return (rank - f_.ranks_per_node + Size()) % Size(); }

  void SendToCopyHolder() {
    if (Size() <= f_.ranks_per_node) return;  // one node: no copy
    constexpr size_t kPiece = size_t{1} << 30;
    std::vector<MPI_Request> req;
    for (size_t at = 0; at < data_.size(); at += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, data_.size() - at));
      req.emplace_back();
      MPI_Irecv(scratch_.data() + at, n, MPI_BYTE, CopySender(Rank()), 1, MPI_COMM_WORLD,
                &req.back());
      req.emplace_back();
      MPI_Isend(data_.data() + at, n, MPI_BYTE, CopyHolder(Rank()), 1, MPI_COMM_WORLD, &req.back());
    }
    MPI_Waitall(static_cast<int>(req.size()), req.data(), MPI_STATUSES_IGNORE);
  }

  std::unique_ptr<CheckpointManager> Open(bool two_tiers) {
    Options o;
    o.max_to_keep = 1;
    o.collective_timeout_seconds = 600;
    if (two_tiers) {
      const int node = Rank() / f_.ranks_per_node;
      o.local_dir = fmt::format("{}/node{}", f_.local, node);
      o.node_id = node;  // local_max_to_keep: the default, 2
    }
    auto m = CheckpointManager::Open(MPI_COMM_WORLD, f_.dir + (two_tiers ? "/two" : "/one"), o);
    Check(m.status(), "open");
    return std::move(m).value();
  }

  // A new manager, which must list `step` as restorable from the local tier.
  std::unique_ptr<CheckpointManager> OpenWithLocalStep(int64_t step, const char* after) {
    auto m = Open(true);
    auto tiers = m->Steps();
    if (!tiers.ok() || tiers->empty() || tiers->back().step != step || !tiers->back().local) {
      Fail(fmt::format("step {} is not restorable from the local tier after {}", step, after));
    }
    return m;
  }

  // (stall, save to commit), each the maximum over the ranks.
  std::pair<double, double> Save(CheckpointManager& m, int64_t step, SaveTier tier) {
    std::vector<ArrayToSave> a{{"x", DType::kUInt8, {shape_[0], 4096}, {}}};
    a[0].shards.push_back(Shard{Box{{box_.start[0], 0}, {rows_, 4096}}, data_.data()});
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    SaveOptions so;
    so.tier = tier;
    Check(m.Save(step, a, {}, so), "save");
    const double stall = Since(t0);
    Check(m.WaitUntilFinished(), "commit");
    const double commit = Since(t0);
    return {MaxOverRanks(stall), MaxOverRanks(commit)};
  }

  // Into the touched scratch buffer, or (`fresh`) into fresh memory.
  double Restore(CheckpointManager& m, int64_t step, RestoreSource source, bool fresh = false) {
    std::optional<HugePageBuffer> fresh_buffer;
    std::byte* dest = scratch_.data();
    if (fresh) {
      dest = fresh_buffer.emplace(data_.size(), /*touch=*/false).data();
      if (dest == nullptr) Fail("cannot map fresh memory");
    } else {
      std::memset(scratch_.data(), 0, scratch_.size());
    }
    std::vector<ArrayToRestore> a{{"x", DType::kUInt8, {}}};
    a[0].shards.push_back(Destination{Box{{box_.start[0], 0}, {rows_, 4096}}, dest});
    RestoreOptions ro;
    ro.source = source;
    ro.prefault = f_.prefault;
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    Check(m.Restore(step, a, ro), "restore");
    const double t = MaxOverRanks(Since(t0));
    if (std::memcmp(dest, data_.data(), data_.size()) != 0) {
      Fail(fmt::format("restore of step {} gave other bytes than were saved", step));
    }
    return t;
  }

  void LoseLastNode() {
    MPI_Barrier(MPI_COMM_WORLD);
    const int last = (Size() - 1) / f_.ranks_per_node;
    if (Rank() == 0) std::filesystem::remove_all(fmt::format("{}/node{}", f_.local, last));
    MPI_Barrier(MPI_COMM_WORLD);
  }

  void Clean() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (Rank() == 0) {
      std::filesystem::remove_all(f_.dir);
      std::filesystem::remove_all(f_.local);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  const Flags f_;
  const int64_t rows_;
  std::vector<int64_t> shape_;
  Box box_;
  std::vector<std::byte> data_, scratch_;
};

}  // namespace
}  // namespace mhckpt::bench

int main(int argc, char** argv) {
  mhckpt::bench::Flags f;
  CLI::App app{"mhckpt-tier-bench: the local tier against memcpy + MPI send and the shared root"};
  app.add_option("--mib", f.mib, "MiB per rank");
  app.add_option("--ranks-per-node", f.ranks_per_node, "ranks per simulated node");
  app.add_option("--reps", f.reps, "repetitions of each figure");
  app.add_option("--dir", f.dir, "shared root (removed at the end)");
  app.add_option("--local", f.local, "local dirs, one per node below it (removed at the end)");
  app.add_option("--json", f.json, "write the figures here (rank 0)");
  app.add_option("--prefault", f.prefault, "RestoreOptions::prefault of every restore");
  return mhckpt::bench::BenchMain(argc, argv, app, &f.json, [&] {
    nlohmann::json out = mhckpt::bench::Bench(f).Run();
    out["ranks_per_node"] = f.ranks_per_node;
    out["mib_per_rank"] = f.mib;
    out["reps"] = f.reps;
    out["prefault"] = f.prefault;
    return out;
  });
}
