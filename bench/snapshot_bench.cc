// mhckpt-snapshot-bench: what CheckpointManager::Save costs a training loop.
//
//   mpirun -np 2 build/bin/mhckpt-snapshot-bench --mib 256 --json out.json
//
// One run measures, in this order, after a warm-up, by medians over repeats
// (docs/PERFORMANCE.md explains each figure and its target):
//   1. memory  the extra peak RSS of a first save, a warm-up save and bursts
//              of back-to-back saves, against the local checkpoint bytes;
//              the bursts also give per-save stall and budget wait with the
//              default budget (one copy);
//   2. stall   Save's wall time in the steady state (staging already touched,
//              the previous save committed), interleaved with a plain memcpy
//              of the same local bytes into touched memory right before and
//              after it; the first save is reported apart (it touches fresh
//              staging memory);
//   3. phases  plan (cached, and not cached), write, flush, commit;
//   4. bursts  again with a budget of several copies: no wait, more memory.
// With several ranks a figure is the slowest rank's (per sample the maximum
// over ranks, then the median over samples): a training loop's next
// collective waits for the slowest rank. --np-info adds each rank's own.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "bench/model.h"
#include "coordinator/checkpoint_manager.h"

namespace mhckpt::bench {
namespace {

using json = nlohmann::json;

constexpr double kStallTarget = 1.1;                     // Save / memcpy, steady state
constexpr uint64_t kRssSlackBytes = uint64_t{64} << 20;  // extra RSS <= local + 64 MiB

struct Flags {
  double mib = 256;       // sharded state, all ranks together (= local bytes at np=1)
  int saves = 5;          // steady-state repeats
  int uncached = 3;       // saves with a changed array set (plan not cached)
  int burst = 3;          // saves per back-to-back burst
  int bursts = 2;         // measured bursts per budget
  int budget_copies = 3;  // the larger budget, in copies of the local checkpoint
  int small = 64;         // small replicated arrays
  int threads = 0;        // Options::snapshot_threads
  std::string transfer = "independent";
  std::string dir;
  std::string json_path;
  std::string note;
  bool np_info = false;
  bool keep = false;
};

void Barrier() { MPI_Barrier(MPI_COMM_WORLD); }

// ---------------------------------------------------------------------------
// The model (bench/model.h): a mixed-precision training state sharded by rows,
// plus small arrays every rank holds whole (replicas).

// A plain memcpy of every local box into `dst` (touched), one thread.
// `cpu` gets the process CPU time it took.
double TimedMemcpy(const Model& m, std::byte* dst, double* cpu = nullptr) {
  const double c0 = ProcessCpuSeconds();
  auto t0 = Clock::now();
  size_t offset = 0;
  for (auto [src, bytes] : m.boxes) {
    std::memcpy(dst + offset, src, bytes);
    offset += bytes;
  }
  asm volatile("" : : "r"(dst) : "memory");  // the copy is not dead
  double dt = Since(t0);
  if (cpu != nullptr) *cpu = ProcessCpuSeconds() - c0;
  return dt;
}

// ---------------------------------------------------------------------------
// Saves and their timings.

// Per-rank timings as the maximum over ranks (collective).
SaveTimings SlowestRank(const SaveTimings& t) {
  std::vector<double> v{t.budget_wait,
                        t.snapshot,
                        t.plan,
                        t.write,
                        t.flush,
                        t.commit,
                        t.gc,
                        t.plan_cached ? 0.0 : 1.0,
                        static_cast<double>(t.local_bytes),
                        static_cast<double>(t.written_bytes)};
  v = MaxOverRanks(v);
  SaveTimings out;
  out.budget_wait = v[0];
  out.snapshot = v[1];
  out.plan = v[2];
  out.write = v[3];
  out.flush = v[4];
  out.commit = v[5];
  out.gc = v[6];
  out.plan_cached = v[7] == 0;
  out.local_bytes = static_cast<uint64_t>(v[8]);
  out.written_bytes = static_cast<uint64_t>(v[9]);
  return out;
}

json TimingsJson(const SaveTimings& t) {
  return json{{"budget_wait_s", t.budget_wait},
              {"snapshot_s", t.snapshot},
              {"plan_s", t.plan},
              {"plan_cached", t.plan_cached},
              {"write_s", t.write},
              {"flush_s", t.flush},
              {"commit_s", t.commit},
              {"gc_s", t.gc},
              {"local_bytes", t.local_bytes},
              {"written_bytes", t.written_bytes}};
}

// Median of each phase over `ts`.
json MedianTimingsJson(const std::vector<SaveTimings>& ts) {
  auto med = [&](double SaveTimings::*field) {
    std::vector<double> v;
    for (const SaveTimings& t : ts) v.push_back(t.*field);
    return Median(v);
  };
  bool all_cached = !ts.empty(), none_cached = true;
  for (const SaveTimings& t : ts) {
    all_cached &= t.plan_cached;
    none_cached &= !t.plan_cached;
  }
  return json{{"saves", ts.size()},
              {"plan_cached", all_cached    ? json(true)
                              : none_cached ? json(false)
                                            : json("mixed")},
              {"budget_wait_s", med(&SaveTimings::budget_wait)},
              {"snapshot_s", med(&SaveTimings::snapshot)},
              {"plan_s", med(&SaveTimings::plan)},
              {"write_s", med(&SaveTimings::write)},
              {"flush_s", med(&SaveTimings::flush)},
              {"commit_s", med(&SaveTimings::commit)},
              {"gc_s", med(&SaveTimings::gc)}};
}

bool SameTimings(const SaveTimings& a, const SaveTimings& b) {
  return a.budget_wait == b.budget_wait && a.snapshot == b.snapshot && a.plan == b.plan &&
         a.write == b.write && a.flush == b.flush && a.commit == b.commit && a.gc == b.gc;
}

// LastSaveTimings() keeps only the last finished save; during a burst this
// thread polls it every millisecond and keeps each new record, so every save
// of the burst has its timings (a commit takes far longer than a millisecond,
// and saves finish in order).
class TimingsRecorder {
 public:
  explicit TimingsRecorder(const CheckpointManager& mgr)
      : mgr_(mgr), last_(mgr.LastSaveTimings()), thread_([this] { Loop(); }) {}
  ~TimingsRecorder() { Stop(); }
  TimingsRecorder(const TimingsRecorder&) = delete;
  TimingsRecorder& operator=(const TimingsRecorder&) = delete;

  // Call after WaitUntilFinished: every save of the burst has finished.
  std::vector<SaveTimings> Finish() {
    Stop();
    Poll();
    return seen_;
  }

 private:
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void Poll() {
    SaveTimings t = mgr_.LastSaveTimings();
    if (!SameTimings(t, last_)) {
      seen_.push_back(t);
      last_ = t;
    }
  }
  void Loop() {
    while (!stop_) {
      Poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  const CheckpointManager& mgr_;
  SaveTimings last_;
  std::vector<SaveTimings> seen_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts after the fields above exist
};

// Aborts every rank with `s` if it is an error on any rank.
void CheckOk(const Status& s, const char* what) {
  int bad = s.ok() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad == 0) return;
  if (!s.ok()) {
    fmt::print(stderr, "mhckpt-snapshot-bench: rank {}: {}: {}\n", Rank(), what, s.ToString());
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
}

std::unique_ptr<CheckpointManager> OpenOrDie(const std::string& dir, const Options& o) {
  Result<std::unique_ptr<CheckpointManager>> m = CheckpointManager::Open(MPI_COMM_WORLD, dir, o);
  CheckOk(m.status(), "open");
  return std::move(m).value();
}

// Save's wall time; `faults` gets the minor page faults it took and `cpu`
// the process CPU time, every thread (the I/O thread is idle meanwhile
// unless a burst is running).
double TimedSave(CheckpointManager& mgr, int64_t step, std::span<const ArrayToSave> arrays,
                 double* faults = nullptr, double* cpu = nullptr) {
  const double f0 = MinorFaults(), c0 = ProcessCpuSeconds();
  auto t0 = Clock::now();
  Status s = mgr.Save(step, arrays);
  double dt = Since(t0);
  if (cpu != nullptr) *cpu = ProcessCpuSeconds() - c0;
  if (faults != nullptr) *faults = MinorFaults() - f0;
  CheckOk(s, "save");
  return dt;
}

// One save followed by the wait for its commit; returns the slowest rank's stall.
struct SingleSave {
  double stall = 0;
  double faults = 0;
  SaveTimings timings;
};
SingleSave SaveAndWait(CheckpointManager& mgr, int64_t step, std::span<const ArrayToSave> arrays) {
  Barrier();
  SingleSave out;
  out.stall = TimedSave(mgr, step, arrays, &out.faults);
  CheckOk(mgr.WaitUntilFinished(), "commit");
  out.stall = MaxOverRanks(out.stall);
  out.faults = MaxOverRanks(out.faults);
  out.timings = SlowestRank(mgr.LastSaveTimings());
  return out;
}

// Back-to-back saves, as a loop that saves every step without waiting.
struct Bursts {
  int k = 0;
  size_t budget_bytes = 0;
  std::vector<std::vector<double>> stall;        // [burst][save], slowest rank
  std::vector<std::vector<double>> budget_wait;  // [burst][save], slowest rank; -1 unknown
  std::vector<std::vector<double>> snapshot;     // [burst][save]
  std::vector<double> total;                     // [burst] first Save → all committed
  uint64_t staging_max_bytes = 0;                // over saves and ranks

  json Json(const Model& m) const {
    auto per_save = [&](const std::vector<std::vector<double>>& v) {
      json out = json::array();
      for (int j = 0; j < k; ++j) {
        std::vector<double> col;
        for (const auto& b : v) {
          if (b[j] >= 0) col.push_back(b[j]);
        }
        out.push_back(col.empty() ? json(nullptr) : json(Median(col)));
      }
      return out;
    };
    return json{
        {"k", k},
        {"bursts", total.size()},
        {"budget_bytes", budget_bytes},
        {"stall_s", per_save(stall)},
        {"budget_wait_s", per_save(budget_wait)},
        {"snapshot_s", per_save(snapshot)},
        {"total_s", Median(total)},
        {"staging_max_bytes", staging_max_bytes},
        {"staging_copies", static_cast<double>(staging_max_bytes) /
                               static_cast<double>(std::max<uint64_t>(m.local_bytes, 1))},
        {"samples", {{"stall_s", stall}, {"budget_wait_s", budget_wait}, {"total_s", total}}}};
  }
};

Bursts RunBursts(CheckpointManager& mgr, const Model& m, int k, int bursts, int64_t* step) {
  Bursts out;
  out.k = k;
  for (int b = 0; b < bursts; ++b) {
    std::vector<double> stall(k), wait(k, -1), snap(k, -1);
    uint64_t staging = 0;
    Barrier();
    double total = 0;
    {
      TimingsRecorder rec(mgr);
      auto t0 = Clock::now();
      for (int j = 0; j < k; ++j) {
        stall[j] = TimedSave(mgr, (*step)++, m.arrays);
        staging = std::max<uint64_t>(staging, mgr.StagingBytes());
      }
      CheckOk(mgr.WaitUntilFinished(), "commit");
      total = Since(t0);
      staging = std::max<uint64_t>(staging, mgr.StagingBytes());
      std::vector<SaveTimings> seen = rec.Finish();
      if (seen.size() == static_cast<size_t>(k)) {
        for (int j = 0; j < k; ++j) {
          wait[j] = seen[j].budget_wait;
          snap[j] = seen[j].snapshot;
        }
      } else {
        fmt::print(stderr, "mhckpt-snapshot-bench: rank {}: saw {} of {} save timings\n", Rank(),
                   seen.size(), k);
      }
    }
    out.stall.push_back(MaxOverRanks(stall));
    out.budget_wait.push_back(MaxOverRanks(wait));
    out.snapshot.push_back(MaxOverRanks(snap));
    out.total.push_back(MaxOverRanks(total));
    out.staging_max_bytes = std::max<uint64_t>(
        out.staging_max_bytes, static_cast<uint64_t>(MaxOverRanks(static_cast<double>(staging))));
  }
  return out;
}

// ---------------------------------------------------------------------------
// The run.

struct MemoryFigure {
  ProcMemory baseline, peak;
  bool hwm_reset = false;
  [[nodiscard]] double extra() const {
    return static_cast<double>(peak.hwm_bytes) - static_cast<double>(baseline.rss_bytes);
  }
};

MemoryFigure StartMemory() {
  Barrier();
  MemoryFigure f;
  f.hwm_reset = ResetPeakRss();
  f.baseline = ReadProcMemory();
  return f;
}

json MemoryJson(const MemoryFigure& f, const Model& m) {
  // The slowest rank is the one with the largest ratio.
  std::vector<double> extras = AllGather(f.extra());
  std::vector<double> locals = AllGather(static_cast<double>(m.local_bytes));
  std::vector<double> baselines = AllGather(static_cast<double>(f.baseline.rss_bytes));
  std::vector<double> peaks = AllGather(static_cast<double>(f.peak.hwm_bytes));
  size_t worst = 0;
  for (size_t r = 0; r < extras.size(); ++r) {
    if (extras[r] / locals[r] > extras[worst] / locals[worst]) worst = r;
  }
  json per_rank = json::array();
  for (size_t r = 0; r < extras.size(); ++r) {
    per_rank.push_back({{"rank", r},
                        {"baseline_rss_bytes", baselines[r]},
                        {"peak_rss_bytes", peaks[r]},
                        {"extra_bytes", extras[r]},
                        {"ratio", extras[r] / locals[r]}});
  }
  const double limit = locals[worst] + static_cast<double>(kRssSlackBytes);
  return json{{"rank", worst},
              {"baseline_rss_bytes", baselines[worst]},
              {"peak_rss_bytes", peaks[worst]},
              {"extra_bytes", extras[worst]},
              {"local_bytes", locals[worst]},
              {"ratio", extras[worst] / locals[worst]},
              {"limit_bytes", limit},
              {"met", extras[worst] <= limit},
              {"hwm_reset", f.hwm_reset},
              {"per_rank", per_rank}};
}

// The root of this run's checkpoints: a fresh directory under --dir.
std::string RunDir(const Flags& f) {
  std::string parent = f.dir;
  if (parent.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    parent = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  long pid = Rank() == 0 ? static_cast<long>(getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return fmt::format("{}/mhckpt-snapshot-bench-{}", parent, pid);
}

json Run(const Flags& f) {
  const int rank = Rank(), size = Size();
  const std::string root = RunDir(f);
  Options options;
  options.transfer = f.transfer == "collective" ? Transfer::kCollective : Transfer::kIndependent;
  options.snapshot_threads = f.threads;
  options.max_to_keep = 2;  // bounds the disk used; retention time shows as gc
  json out;
  const std::string load_before = LoadAverage();

  Model m = BuildModel(TrainingStateConfig{f.mib, f.small, false}, rank, size);
  const double local = static_cast<double>(m.local_bytes);

  // 1. Memory, the first save, and bursts with the default budget (one copy).
  MemoryFigure mem = StartMemory();
  auto mgr = OpenOrDie(root + "/default", options);
  int64_t step = 0;
  SingleSave first = SaveAndWait(*mgr, step++, m.arrays);
  const size_t one_copy =
      static_cast<size_t>(MaxOverRanks(static_cast<double>(mgr->StagingBytes())));
  SingleSave warm = SaveAndWait(*mgr, step++, m.arrays);
  Bursts default_bursts = RunBursts(*mgr, m, f.burst, f.bursts, &step);
  default_bursts.budget_bytes = one_copy;
  mem.peak = ReadProcMemory();
  out["rss"] = MemoryJson(mem, m);

  // 2. Stall in the steady state against memcpy, interleaved. Two targets,
  // both touched before any timing: plain heap memory (the baseline of the
  // target), and memory mapped as the staging pool maps it (huge pages).
  std::unique_ptr<std::byte[]> ref(new std::byte[std::max<uint64_t>(m.local_bytes, 1)]);
  std::memset(ref.get(), 0x5A, m.local_bytes);
  HugePageBuffer ref_huge(m.local_bytes);
  if (ref_huge.data() == nullptr) CheckOk(IoError("cannot map the huge-page reference"), "mmap");
  TimedMemcpy(m, ref.get());  // warm-up
  TimedMemcpy(m, ref_huge.data());
  std::vector<double> copies, stalls, own_copies, own_stalls, faults, copy_cpu, save_cpu;
  std::vector<double> copies_huge;
  std::vector<double> outside;  // Save's wall time not spent in TakeSnapshot
  std::vector<SaveTimings> cached;
  for (int i = 0; i <= f.saves; ++i) {
    Barrier();
    double cpu = 0;
    double c = TimedMemcpy(m, ref.get(), &cpu);
    own_copies.push_back(c);
    copies.push_back(MaxOverRanks(c));
    copy_cpu.push_back(MaxOverRanks(cpu));
    Barrier();
    copies_huge.push_back(MaxOverRanks(TimedMemcpy(m, ref_huge.data())));
    if (i == f.saves) break;
    Barrier();
    double fault_count = 0;
    double s = TimedSave(*mgr, step++, m.arrays, &fault_count, &cpu);
    own_stalls.push_back(s);
    stalls.push_back(MaxOverRanks(s));
    save_cpu.push_back(MaxOverRanks(cpu));
    faults.push_back(MaxOverRanks(fault_count));
    CheckOk(mgr->WaitUntilFinished(), "commit");
    const SaveTimings mine = mgr->LastSaveTimings();
    outside.push_back(MaxOverRanks(s - mine.snapshot - mine.budget_wait));
    cached.push_back(SlowestRank(mine));
  }

  // 3. Plan not cached: every save changes the set of arrays.
  std::vector<SaveTimings> uncached;
  for (int i = 0; i < f.uncached; ++i) {
    uncached.push_back(
        SaveAndWait(*mgr, step++, i % 2 == 0 ? m.arrays_with_extra : m.arrays).timings);
  }
  mgr.reset();  // waits, and unmaps its staging

  // 4. Bursts with a budget of several copies (fresh buffers: a warm-up burst first).
  Options big = options;
  big.staging_budget_bytes = static_cast<size_t>(f.budget_copies) * one_copy;
  MemoryFigure big_mem = StartMemory();
  mgr = OpenOrDie(root + "/budget", big);
  step = 0;
  Bursts big_warmup = RunBursts(*mgr, m, f.burst, 1, &step);
  Bursts big_bursts = RunBursts(*mgr, m, f.burst, f.bursts, &step);
  big_warmup.budget_bytes = big_bursts.budget_bytes = big.staging_budget_bytes;
  big_mem.peak = ReadProcMemory();
  json big_rss = MemoryJson(big_mem, m);
  mgr.reset();

  Barrier();
  if (rank == 0 && !f.keep) {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }

  // Report.
  const double copy_med = Median(copies), stall_med = Median(stalls);
  std::vector<double> locals = AllGather(local);
  MachineInfo machine = DescribeMachine();
  const char* io = std::getenv("OMPI_MCA_io");
  int threads = f.threads > 0
                    ? f.threads
                    : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  out["bench"] = "snapshot";
  out["date"] = UtcNow();
  out["note"] = f.note;
  out["machine"] = {{"host", machine.host},
                    {"kernel", machine.kernel},
                    {"cpu", machine.cpu_model},
                    {"cores", machine.cores},
                    {"mem_total_bytes", machine.mem_total_bytes},
                    {"transparent_hugepages", machine.transparent_hugepages},
                    {"loadavg_before", load_before},
                    {"loadavg_after", LoadAverage()}};
  out["config"] = {{"np", size},
                   {"mib", f.mib},
                   {"global_bytes", m.global_bytes},
                   {"local_bytes_max", *std::max_element(locals.begin(), locals.end())},
                   {"local_bytes_min", *std::min_element(locals.begin(), locals.end())},
                   {"replicated_bytes_per_rank", m.replicated_bytes},
                   {"large_arrays", m.large_arrays},
                   {"small_arrays", m.small_arrays},
                   {"snapshot_threads", threads},
                   {"transfer", f.transfer},
                   {"mpi_io", io != nullptr ? io : "default (ompio)"},
                   {"saves", f.saves},
                   {"uncached", f.uncached},
                   {"burst", f.burst},
                   {"bursts", f.bursts},
                   {"budget_copies", f.budget_copies},
                   {"max_to_keep", options.max_to_keep}};
  out["memcpy"] = {{"median_s", copy_med},
                   {"min_s", *std::min_element(copies.begin(), copies.end())},
                   {"gibps", GiBps(local, copy_med)},
                   {"cpu_median_s", Median(copy_cpu)},
                   {"huge_pages_median_s", Median(copies_huge)},
                   {"huge_pages_samples_s", copies_huge},
                   {"samples_s", copies}};
  out["stall"] = {{"first_s", first.stall},
                  {"first_ratio", first.stall / copy_med},
                  {"first_timings", TimingsJson(first.timings)},
                  {"first_minor_faults", first.faults},
                  {"steady_minor_faults_median", Median(faults)},
                  {"steady_min_s", *std::min_element(stalls.begin(), stalls.end())},
                  {"steady_cpu_median_s", Median(save_cpu)},
                  {"steady_outside_snapshot_median_s", Median(outside)},
                  {"steady_ratio_vs_huge_pages", stall_med / Median(copies_huge)},
                  {"warmup_s", warm.stall},
                  {"steady_median_s", stall_med},
                  {"steady_gibps", GiBps(local, stall_med)},
                  {"steady_ratio", stall_med / copy_med},
                  {"steady_overhead_s", stall_med - copy_med},
                  {"samples_s", stalls},
                  {"target_ratio", kStallTarget},
                  {"met", stall_med <= kStallTarget * copy_med}};
  out["phases"] = {{"cached", MedianTimingsJson(cached)},
                   {"uncached", MedianTimingsJson(uncached)}};
  out["bursts"] = {{"default", default_bursts.Json(m)},
                   {"large", big_bursts.Json(m)},
                   {"large_warmup", big_warmup.Json(m)},
                   {"large_rss", big_rss}};
  out["bursts"]["default"]["budget_copies"] = 1;
  out["bursts"]["large"]["budget_copies"] = f.budget_copies;
  out["bursts"]["large_warmup"]["budget_copies"] = f.budget_copies;

  std::vector<double> own_stall = AllGather(Median(own_stalls));
  std::vector<double> own_copy = AllGather(Median(own_copies));
  json ranks = json::array();
  for (int r = 0; r < size; ++r) {
    ranks.push_back({{"rank", r},
                     {"local_bytes", locals[r]},
                     {"steady_stall_s", own_stall[r]},
                     {"memcpy_s", own_copy[r]},
                     {"ratio", own_stall[r] / own_copy[r]},
                     {"rss_extra_bytes", out["rss"]["per_rank"][r]["extra_bytes"]}});
  }
  out["ranks"] = ranks;
  return out;
}

// ---------------------------------------------------------------------------
// The table.

std::string Ms(double s) { return fmt::format("{:9.1f} ms", s * 1e3); }

std::string MetOrMissed(bool met) { return met ? "met" : "MISSED"; }

void PrintTable(const json& r, bool per_rank) {
  const json& c = r["config"];
  const double local = c["local_bytes_max"];
  fmt::print(
      "\nmhckpt snapshot bench — np={}, {:.0f} MiB global ({} large sharded + {} small "
      "replicated arrays), {:.1f} MiB local per rank (max), {} snapshot threads, {} transfer, "
      "MPI-IO {}\n",
      c["np"].get<int>(), MiB(c["global_bytes"].get<double>()), c["large_arrays"].get<int>(),
      c["small_arrays"].get<int>(), MiB(local), c["snapshot_threads"].get<int>(),
      c["transfer"].get<std::string>(), c["mpi_io"].get<std::string>());
  fmt::print("  load average before/after: {} / {} ({} cores)\n",
             r["machine"]["loadavg_before"].get<std::string>(),
             r["machine"]["loadavg_after"].get<std::string>(), r["machine"]["cores"].get<int>());
  const json& st = r["stall"];
  const double copy = r["memcpy"]["median_s"];
  fmt::print("  {:<44} {:>12} {:>8} {:>10}  {}\n", "stall (slowest rank, median)", "time", "GiB/s",
             "vs memcpy", "target");
  fmt::print("  {:<44} {:>12} {:8.2f} {:>10}\n", "memcpy into touched memory", Ms(copy),
             GiBps(local, copy), "1.00x");
  const double huge = r["memcpy"]["huge_pages_median_s"];
  fmt::print("  {:<44} {:>12} {:8.2f} {:9.2f}x\n", "memcpy into touched huge pages (as staging)",
             Ms(huge), GiBps(local, huge), huge / copy);
  fmt::print("  {:<44} {:>12} {:8.2f} {:9.2f}x  <= {:.2f}x: {}\n",
             fmt::format("Save, steady state ({} saves)", c["saves"].get<int>()),
             Ms(st["steady_median_s"]), st["steady_gibps"].get<double>(),
             st["steady_ratio"].get<double>(), kStallTarget, MetOrMissed(st["met"]));
  fmt::print("  {:<44} {:>12} {:8.2f} {:9.2f}x  (fresh staging: first touch)\n", "Save, first save",
             Ms(st["first_s"]), GiBps(local, st["first_s"]), st["first_ratio"].get<double>());
  fmt::print("  {:<44} memcpy{} Save{}; page faults per Save: first {:.0f}, steady {:.0f}\n",
             "  fastest sample", Ms(r["memcpy"]["min_s"]), Ms(st["steady_min_s"]),
             st["first_minor_faults"].get<double>(),
             st["steady_minor_faults_median"].get<double>());
  fmt::print("  {:<44} memcpy{} Save{} (all threads of the process)\n", "  CPU time, median",
             Ms(r["memcpy"]["cpu_median_s"]), Ms(st["steady_cpu_median_s"]));
  fmt::print("  {:<44} {} (Save's wall time minus SaveTimings::snapshot)\n",
             "  Save outside the copy, median", Ms(st["steady_outside_snapshot_median_s"]));
  const json& rss = r["rss"];
  fmt::print("  {:<44} {:9.1f} MiB {:>8} {:9.2f}x  <= 1.00x + 64 MiB: {}\n",
             "extra peak RSS (local bytes: 1.00x)", MiB(rss["extra_bytes"]), "",
             rss["ratio"].get<double>(), MetOrMissed(rss["met"]));

  fmt::print("  phases (median, slowest rank):\n");
  for (const char* which : {"cached", "uncached"}) {
    const json& p = r["phases"][which];
    fmt::print("    plan {:<10} snapshot{} plan{} write{} flush{} commit{} gc{}\n",
               std::string(which) == "cached" ? "cached" : "not cached", Ms(p["snapshot_s"]),
               Ms(p["plan_s"]), Ms(p["write_s"]), Ms(p["flush_s"]), Ms(p["commit_s"]),
               Ms(p["gc_s"]));
  }
  auto print_burst = [&](const char* label, const json& b) {
    fmt::print("  {} (budget {:.0f} MiB = {} copies), {} saves back to back:\n", label,
               MiB(b["budget_bytes"].get<double>()), b["budget_copies"].get<int>(),
               b["k"].get<int>());
    for (int j = 0; j < b["k"].get<int>(); ++j) {
      const json& w = b["budget_wait_s"][j];
      fmt::print("    save {}: stall{}  budget_wait{}\n", j + 1, Ms(b["stall_s"][j]),
                 w.is_null() ? std::string("        n/a") : Ms(w));
    }
    fmt::print("    all committed after{}; host staging at most {:.1f} MiB ({:.2f} copies)\n",
               Ms(b["total_s"]), MiB(b["staging_max_bytes"].get<double>()),
               b["staging_copies"].get<double>());
  };
  print_burst("back-to-back, default budget", r["bursts"]["default"]);
  print_burst("back-to-back, larger budget", r["bursts"]["large"]);
  fmt::print("    extra peak RSS with the larger budget: {:.1f} MiB ({:.2f}x local)\n",
             MiB(r["bursts"]["large_rss"]["extra_bytes"]),
             r["bursts"]["large_rss"]["ratio"].get<double>());
  if (per_rank) {
    fmt::print("  per rank (own medians):\n");
    for (const json& x : r["ranks"]) {
      fmt::print("    rank {}: local {:.1f} MiB, memcpy{}, Save{}, {:.2f}x, extra RSS {:.1f} MiB\n",
                 x["rank"].get<int>(), MiB(x["local_bytes"]), Ms(x["memcpy_s"]),
                 Ms(x["steady_stall_s"]), x["ratio"].get<double>(), MiB(x["rss_extra_bytes"]));
    }
  }
}

}  // namespace
}  // namespace mhckpt::bench

int main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;
  // Why MULTIPLE: without it Save commits inline and there is no overlap to measure.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int rank = mhckpt::bench::Rank();

  mhckpt::bench::Flags f;
  CLI::App app{
      "Measures what CheckpointManager::Save costs a training loop: the stall against a plain "
      "memcpy, the extra peak RSS, back-to-back saves, and the phases of a commit. Run it "
      "under mpirun; see docs/PERFORMANCE.md."};
  app.add_option("--mib", f.mib,
                 "Size of the sharded training state, all ranks together, in MiB (the local "
                 "bytes at np=1, without the small replicated arrays)")
      ->check(CLI::Range(1.0, 65536.0))
      ->capture_default_str();
  app.add_option("--saves", f.saves, "Steady-state saves to take the median of")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--uncached", f.uncached, "Saves with a changed array set (plan not cached)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--burst", f.burst, "Saves per back-to-back burst")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--bursts", f.bursts, "Measured bursts per budget")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--budget-copies", f.budget_copies,
                 "The larger staging budget, in copies of the local checkpoint")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--small", f.small, "Small replicated arrays (16 KiB each)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--threads", f.threads, "Options::snapshot_threads (0: the library's default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--transfer", f.transfer, "HDF5 transfer mode")
      ->check(CLI::IsMember({"independent", "collective"}))
      ->capture_default_str();
  app.add_option("--dir", f.dir,
                 "Parent of the checkpoint directory (a fresh subdirectory, removed at the end; "
                 "default $TMPDIR or /tmp)");
  app.add_option("--json", f.json_path, "Also write the results as a JSON object to this file");
  app.add_option("--note", f.note, "Free text stored in the JSON (e.g. the git commit)");
  app.add_flag("--np-info", f.np_info, "Also print each rank's own figures");
  app.add_flag("--keep", f.keep, "Keep the checkpoints written");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = rank == 0 ? app.exit(e) : e.get_exit_code();
    MPI_Finalize();
    return rc;
  }
  if (provided != MPI_THREAD_MULTIPLE && rank == 0) {
    fmt::print(stderr,
               "mhckpt-snapshot-bench: MPI gave thread level {} (not MULTIPLE): saves commit "
               "inside Save, so the stall includes the write\n",
               provided);
  }

  nlohmann::json result = mhckpt::bench::Run(f);
  int rc = 0;
  if (rank == 0) {
    mhckpt::bench::PrintTable(result, f.np_info);
    if (!f.json_path.empty()) {
      std::ofstream out(f.json_path);
      out << result.dump(2) << "\n";
      if (!out) {
        fmt::print(stderr, "mhckpt-snapshot-bench: cannot write {}\n", f.json_path);
        rc = 1;
      }
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
