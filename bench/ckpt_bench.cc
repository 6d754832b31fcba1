// mhckpt-bench: end-to-end figures of CheckpointManager for bench/run.sh, one
// JSON record per case, in the schema the peers (bench/peers/) write too.
//
//   mpirun -np 2 build/bin/mhckpt-bench --mode save --mib 256 --keep --dir D --json save.json
//   mpirun -np 3 build/bin/mhckpt-bench --mode restore --dir D --drop-caches --json restore.json
//   mpirun -np 2 build/bin/mhckpt-bench --mode many --mib 256 --json many.json
//   mpirun -np 2 build/bin/mhckpt-bench --mode replicated --mib 256 --replica-split-bytes 16777216
//       --json replicated.json
//
// Modes (the models are in bench/model.h):
//   save        case "sharded": the training state of docs/PERFORMANCE.md; a
//               warm-up save (first touch of staging, reported apart), then
//               --reps saves, each after a memcpy of the same local bytes into
//               touched memory; a restore at the same world size verifies the
//               bytes. --keep leaves the checkpoint in D/mhckpt-bench-sharded.
//   restore     case "sharded": restores the latest step under D (what a save
//               --keep wrote, at any world size) into arrays laid out for this
//               world size, --reps times (--drop-caches: the page cache is
//               dropped before each), and verifies every byte.
//   many        cases "many_small" (10,000 arrays; --arrays) and "one_array"
//               (the same bytes in one array): save, commit and restore of each
//               (--case: one of them).
// A profile of the timed restores alone (rank 0 switches perf on and off):
//   mkfifo /tmp/ctl /tmp/ack
//   perf record -D -1 --control fifo:/tmp/ctl,/tmp/ack -g -- build/bin/mhckpt-bench
//       --mode many --case many_small --drop-caches --perf-control /tmp/ctl,/tmp/ack
//   replicated  case "replicated": the training state held whole by every rank
//               (pure data parallel), saved with
//               Options::replica_parallel_min_bytes = --replica-split-bytes.
// Every timed step follows a barrier; a figure is per rep the maximum over the
// ranks, then the median over the reps. A restore that does not give back
// the saved bytes exits non-zero (after writing the JSON).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "bench/model.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/storage.h"
#include "programs/main_guard.h"

#ifndef MHCKPT_SOURCE_DIR
#define MHCKPT_SOURCE_DIR "."
#endif

namespace mhckpt::bench {
namespace {

using json = nlohmann::json;

constexpr const char* kProgram = "mhckpt-bench";
// Metadata stored with a save, read back by --mode restore.
constexpr const char* kShardedKey = "bench_sharded";  // names of the arrays split over ranks
constexpr const char* kMibKey = "bench_mib";

struct Flags {
  std::string mode;
  double mib = 256;
  int reps = 5;
  int small = 64;
  int arrays = kManySmallArrays;
  int threads = 0;
  std::string transfer = "independent";
  std::string data_path = "direct";
  int writer_threads = 0;
  std::string dir;
  std::string json_path;
  std::string version_tag;
  std::string launcher = "mpirun";
  std::string note;
  uint64_t replica_split_bytes = 0;
  bool keep = false;
  bool drop_caches = false;
  uint64_t chunk_bytes = 0;  // Options::checksum_chunk_bytes
  int format = 0;            // Options::format_version (0: the library's default)
  int ranks_per_file = 0;    // Options::files (0: one data file; -1: one per node)
  bool no_verify_checksums = false;
  std::string prefault = "on";      // RestoreOptions::prefault
  std::string direct_reads = "on";  // RestoreOptions::direct_reads
  std::string dest_pages = "huge";  // restore destinations: advised as numpy's (huge) or not
  std::string only_case;            // many: one of its two cases only
  std::string perf_control;         // "CTL,ACK": perf record --control fifo:CTL,ACK
};

void Barrier() { MPI_Barrier(MPI_COMM_WORLD); }

// Aborts every rank with `s` if it is an error on any rank.
void CheckOk(const Status& s, const char* what) {
  int bad = s.ok() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad == 0) return;
  if (!s.ok()) fmt::print(stderr, "{}: rank {}: {}: {}\n", kProgram, Rank(), what, s.ToString());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

uint64_t MaxOverRanksU64(uint64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

uint64_t SumOverRanksU64(uint64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

// `git describe` of the source tree, run before MPI_Init (no fork after it).
std::string GitDescribe() {
  const std::string cmd =
      fmt::format("git -C '{}' describe --always --dirty --tags 2>/dev/null", MHCKPT_SOURCE_DIR);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  char buf[256] = {};
  std::string out;
  if (std::fgets(buf, sizeof(buf), p) != nullptr) out = buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string ParentDir(const Flags& f) {
  if (!f.dir.empty()) return f.dir;
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

// Rank 0 removes `path` (and everything under it); collective.
void RemoveAll(const std::string& path) {
  if (Rank() == 0) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  Barrier();
}

Options MakeOptions(const Flags& f) {
  Options o;
  o.transfer = f.transfer == "collective" ? Transfer::kCollective : Transfer::kIndependent;
  o.snapshot_threads = f.threads;
  o.data_path = f.data_path == "hdf5"       ? DataPath::kHdf5
                : f.data_path == "buffered" ? DataPath::kBuffered
                                            : DataPath::kDirect;
  o.writer_threads = f.writer_threads;
  o.max_to_keep = 2;  // bounds the disk; the deletes run after the commit is reported
  o.replica_parallel_min_bytes = f.replica_split_bytes;
  o.checksum_chunk_bytes = f.chunk_bytes;
  if (f.format != 0) o.format_version = f.format;
  o.files.ranks_per_file = f.ranks_per_file;
  return o;
}

std::unique_ptr<CheckpointManager> OpenOrDie(const std::string& root, const Options& o) {
  Result<std::unique_ptr<CheckpointManager>> m = CheckpointManager::Open(MPI_COMM_WORLD, root, o);
  CheckOk(m.status(), "open");
  return std::move(m).value();
}

// Bytes of step `step`'s files (data file and marker) under `root`; rank 0's view.
uint64_t FileBytes(const std::string& root, int64_t step) {
  double bytes = 0;
  if (Rank() == 0) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(io::StepDir(root, step), ec)) {
      if (e.is_regular_file(ec)) bytes += static_cast<double>(e.file_size(ec));
    }
  }
  MPI_Bcast(&bytes, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return static_cast<uint64_t>(bytes);
}

// ---------------------------------------------------------------------------
// Timed steps.

// A plain memcpy of every local box into `dst` (touched), one thread.
double TimedMemcpy(const Model& m, std::byte* dst) {
  auto t0 = Clock::now();
  size_t offset = 0;
  for (auto [src, bytes] : m.boxes) {
    std::memcpy(dst + offset, src, bytes);
    offset += bytes;
  }
  asm volatile("" : : "r"(dst) : "memory");  // the copy is not dead
  return Since(t0);
}

struct SaveSample {
  double stall = 0;   // Save()
  double commit = 0;  // Save() start until WaitUntilFinished() returns
  double gc = 0;      // of commit: retention deletes (rank 0)
  // LastSaveTimings(), slowest rank: snapshot, plan, write, flush, commit.
  std::vector<double> phases;
};
constexpr const char* kPhases[] = {"snapshot_s", "plan_s", "write_s", "flush_s", "marker_commit_s"};

// One save and the wait for its commit; the slowest rank's figures.
SaveSample TimedSave(CheckpointManager& mgr, int64_t step, std::span<const ArrayToSave> arrays,
                     const UserMetadata& metadata) {
  Barrier();
  auto t0 = Clock::now();
  Status s = mgr.Save(step, arrays, metadata);
  const double stall = Since(t0);
  Status w = mgr.WaitUntilFinished();
  const double commit = Since(t0);
  CheckOk(s.ok() ? w : s, "save");
  const SaveTimings t = mgr.LastSaveTimings();
  std::vector<double> v =
      MaxOverRanks({stall, commit, t.gc, t.snapshot, t.plan, t.write, t.flush, t.commit});
  return SaveSample{v[0], v[1], v[2], {v.begin() + 3, v.end()}};
}

// Extra peak RSS: VmHWM reset, then VmRSS read; later VmHWM minus that.
struct MemoryFigure {
  ProcMemory baseline;
  bool hwm_reset = false;
};

MemoryFigure StartMemory() {
  Barrier();
  MemoryFigure m;
  m.hwm_reset = ResetPeakRss();
  m.baseline = ReadProcMemory();
  return m;
}

// Collective: the largest extra peak RSS over the ranks.
uint64_t ExtraPeakRss(const MemoryFigure& m) {
  const uint64_t peak = ReadProcMemory().hwm_bytes;
  return MaxOverRanksU64(peak > m.baseline.rss_bytes ? peak - m.baseline.rss_bytes : 0);
}

struct RestoreRun {
  std::vector<double> restore;  // per rep, slowest rank
  bool verified = true;
  bool drop_caches_ok = true;
  std::string first_bad;
  uint64_t local_bytes = 0;  // this rank's destination bytes
  size_t arrays = 0;
  uint64_t rss_extra = 0;  // extra peak RSS over the destinations, worst rank
  bool hwm_reset = false;
  uint64_t direct_bytes = 0;  // read with O_DIRECT by this rank, over the timed restores
};

// The timed restores' options, from the flags.
RestoreOptions Restoring(const Flags& f) {
  RestoreOptions o;
  o.verify_checksums = !f.no_verify_checksums;
  o.prefault = f.prefault == "on";
  o.direct_reads = f.direct_reads == "on";
  return o;
}

// What the records say of the destinations' pages.
std::string DestPagesNote(const Flags& f) {
  return std::string(f.dest_pages == "huge"
                         ? "advised MADV_HUGEPAGE from 4 MiB, as numpy advises "
                           "its new arrays (dest_pages huge)"
                         : "left to the kernel's default pages (dest_pages base)") +
         ", page-aligned as mhckpt-py's new arrays; direct reads " + f.direct_reads;
}

// Turns `perf record -D -1 --control fifo:CTL,ACK` on or off ("CTL,ACK" in
// `fifos`; nothing if empty) and waits for perf to acknowledge, on rank 0,
// so that a profile holds the timed restores alone.
void PerfControl(const std::string& fifos, const char* command) {
  if (fifos.empty() || Rank() != 0) return;
  const size_t comma = fifos.find(',');
  if (std::ofstream ctl(fifos.substr(0, comma)); ctl) ctl << command << '\n' << std::flush;
  if (comma == std::string::npos) return;
  std::ifstream ack(fifos.substr(comma + 1));
  std::string line;
  std::getline(ack, line);
}

// How RunRestores treats the destination memory.
enum class Dest {
  kReused,  // one set, touched, scrubbed before each restore
  kFresh,   // new, untouched buffers for each restore, as a framework's new arrays are
};

// `reps` restores of `step` into arrays of `specs` laid out for this world
// size, each verified, after `warmup` untimed ones (the warm-up every system
// of bench/run.sh gets); with `drop`, the page cache is dropped before each.
RestoreRun RunRestores(CheckpointManager& mgr, int64_t step, const std::vector<ArraySpec>& specs,
                       int reps, bool drop, Dest dest, int warmup = 0,
                       const RestoreOptions& options = {}, bool huge_pages = false,
                       const std::string& perf_control = {}) {
  const int rank = Rank(), size = Size();
  RestoreRun out;
  std::optional<Destinations> d;
  MemoryFigure mem = StartMemory();
  for (int i = -warmup; i < reps; ++i) {
    if (dest == Dest::kFresh || !d) {
      d.reset();  // freed first: the new buffers do not add to the old ones
      d.emplace(
          AllocateDestinations(specs, rank, size, /*touch=*/dest == Dest::kReused, huge_pages));
    }
    if (dest == Dest::kReused) d->Scrub(std::byte{0xA5});
    if (drop) out.drop_caches_ok &= DropCaches();
    Barrier();
    const uint64_t direct_before = io::Counters().direct_read_bytes;
    if (i >= 0 && !perf_control.empty()) {
      PerfControl(perf_control, "enable");
      Barrier();
    }
    auto t0 = Clock::now();
    Status s = mgr.Restore(step, d->arrays, options);
    const double dt = Since(t0);
    if (i >= 0 && !perf_control.empty()) {
      Barrier();
      PerfControl(perf_control, "disable");
    }
    CheckOk(s, "restore");
    const double slowest = MaxOverRanks(dt);
    if (i >= 0) out.restore.push_back(slowest);
    if (i >= 0) out.direct_bytes += io::Counters().direct_read_bytes - direct_before;
    std::string first_bad;
    int bad = d->Verify(&first_bad);
    if (bad > 0) {
      fmt::print(stderr, "{}: rank {}: restore {} of step {}: {} arrays differ, first {}\n",
                 kProgram, Rank(), i, step, bad, first_bad);
      if (out.first_bad.empty()) out.first_bad = first_bad;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    out.verified &= bad == 0;
  }
  out.local_bytes = d->local_bytes;
  out.arrays = d->specs.size();
  const uint64_t peak = ReadProcMemory().hwm_bytes;
  const uint64_t floor = mem.baseline.rss_bytes + (dest == Dest::kFresh ? d->local_bytes : 0);
  out.rss_extra = MaxOverRanksU64(peak > floor ? peak - floor : 0);
  out.hwm_reset = mem.hwm_reset;
  return out;
}

// The saves of one case, from a fresh manager on a fresh `root`.
struct SaveRun {
  std::unique_ptr<CheckpointManager> mgr;
  SaveSample first;
  std::vector<double> stall, commit, gc, memcpy;
  std::vector<std::vector<double>> phases;  // [phase][rep]
  std::vector<double> written_bytes;        // [rank], the last save
  uint64_t rss_extra = 0;
  bool hwm_reset = false;
  int64_t last_step = -1;
};

SaveRun RunSaves(const Flags& f, const Model& m, const std::string& root, const Options& o,
                 const UserMetadata& metadata) {
  SaveRun out;
  RemoveAll(root);
  // The memcpy target, touched (as staging is after the first save).
  std::unique_ptr<std::byte[]> ref(new std::byte[std::max<uint64_t>(m.local_bytes, 1)]);
  std::memset(ref.get(), 0x5A, m.local_bytes);
  TimedMemcpy(m, ref.get());  // warm-up

  MemoryFigure mem = StartMemory();
  out.mgr = OpenOrDie(root, o);
  int64_t step = 0;
  out.first = TimedSave(*out.mgr, step++, m.arrays, metadata);
  for (int i = 0; i < f.reps; ++i) {
    Barrier();
    out.memcpy.push_back(MaxOverRanks(TimedMemcpy(m, ref.get())));
    SaveSample s = TimedSave(*out.mgr, step++, m.arrays, metadata);
    out.stall.push_back(s.stall);
    out.commit.push_back(s.commit);
    out.gc.push_back(s.gc);
    out.phases.resize(s.phases.size());
    for (size_t p = 0; p < s.phases.size(); ++p) out.phases[p].push_back(s.phases[p]);
  }
  out.rss_extra = ExtraPeakRss(mem);
  out.hwm_reset = mem.hwm_reset;
  out.written_bytes = AllGather(static_cast<double>(out.mgr->LastSaveTimings().written_bytes));
  out.last_step = step - 1;
  return out;
}

// ---------------------------------------------------------------------------
// Records.

std::string g_version;  // GitDescribe(), before MPI_Init

json Record(const Flags& f, const std::string& kase) {
  return json{{"system", "mhckpt"},
              {"version", f.version_tag.empty() ? g_version : f.version_tag},
              {"case", kase},
              {"np", Size()},
              {"restore_np", nullptr},
              {"mib", f.mib},
              {"global_bytes", 0},
              {"local_bytes_max", 0},
              {"reps", f.reps},
              {"stall_s", nullptr},
              {"commit_s", nullptr},
              {"restore_s", nullptr},
              {"reshard_s", nullptr},
              {"peak_rss_extra_bytes", 0},
              {"fsync", true},
              {"verified", false},
              {"launcher", f.launcher},
              {"notes", ""},
              {"samples", json::object()},
              {"transfer", f.transfer},
              {"data_path", f.data_path},
              {"writer_threads", f.writer_threads},
              {"ranks_per_file", f.ranks_per_file},
              {"snapshot_threads", f.threads},
              {"replica_split_bytes", f.replica_split_bytes},
              {"date", UtcNow()},
              {"host", DescribeMachine().host},
              {"loadavg", LoadAverage()}};
}

void AddSaves(json& r, const SaveRun& s, const Model& m) {
  r["global_bytes"] = m.global_bytes;
  r["local_bytes_max"] = MaxOverRanksU64(m.local_bytes);
  r["replicated_bytes_per_rank"] = m.replicated_bytes;
  r["n_arrays"] = m.arrays.size();
  r["sharded_arrays"] = m.large_arrays;
  r["whole_arrays"] = m.small_arrays;
  r["stall_s"] = Median(s.stall);
  r["commit_s"] = Median(s.commit);
  r["memcpy_s"] = Median(s.memcpy);
  r["gc_s"] = Median(s.gc);
  r["first_stall_s"] = s.first.stall;
  r["first_commit_s"] = s.first.commit;
  r["peak_rss_extra_bytes"] = s.rss_extra;
  r["hwm_reset"] = s.hwm_reset;
  r["max_to_keep"] = 2;
  r["written_bytes_per_rank"] = s.written_bytes;  // who wrote what, the last save
  r["samples"]["stall_s"] = s.stall;
  r["samples"]["commit_s"] = s.commit;
  r["samples"]["memcpy_s"] = s.memcpy;
  r["samples"]["gc_s"] = s.gc;
  // The commit without the retention deletes that WaitUntilFinished also waits for.
  std::vector<double> no_retention;
  for (size_t i = 0; i < s.commit.size(); ++i) no_retention.push_back(s.commit[i] - s.gc[i]);
  r["commit_no_retention_s"] = Median(no_retention);
  r["samples"]["commit_no_retention_s"] = no_retention;
  // The phases of a save (SaveTimings; marker_commit_s is SaveTimings::commit).
  json phases = json::object();
  for (size_t p = 0; p < s.phases.size(); ++p) phases[kPhases[p]] = Median(s.phases[p]);
  r["phases"] = phases;
}

constexpr const char* kSaveNotes =
    "stall_s: Save() call; commit_s: Save() start until WaitUntilFinished() returns (data "
    "fsync'd, marker committed; older steps are deleted after it: max_to_keep 2, gc_s, and "
    "WaitUntilFinished waits for that too; commit_no_retention_s = commit_s - gc_s); memcpy_s: "
    "the "
    "same local bytes into touched memory; per rep the slowest rank, median over reps; the "
    "first save (fresh staging) apart as first_stall_s";

std::string WithNote(const Flags& f, std::string notes) {
  if (!f.note.empty()) notes += "; " + f.note;
  return notes;
}

// save: the sharded training state.
json RunSave(const Flags& f) {
  const int rank = Rank(), size = Size();
  const std::string root = ParentDir(f) + "/mhckpt-bench-sharded";
  Model m = BuildModel(TrainingStateConfig{f.mib, f.small, false}, rank, size);
  UserMetadata metadata{{kMibKey, fmt::format("{}", f.mib)}};
  std::string sharded;
  for (const ArraySpec& a : m.specs) {
    if (a.shard) sharded += (sharded.empty() ? "" : ",") + a.name;
  }
  metadata[kShardedKey] = sharded;

  SaveRun s = RunSaves(f, m, root, MakeOptions(f), metadata);
  json r = Record(f, "sharded");
  AddSaves(r, s, m);
  r["file_bytes"] = FileBytes(root, s.last_step);

  // Verify: restore the last step at this world size.
  RestoreRun v = RunRestores(*s.mgr, s.last_step, m.specs, 1, false, Dest::kReused);
  r["verify_restore_s"] = v.restore.front();
  r["verified"] = v.verified;
  r["root"] = root;
  r["kept"] = f.keep;
  r["notes"] = WithNote(f, std::string(kSaveNotes) +
                               "; restore_s: see --mode restore; verify_restore_s: one restore "
                               "at the same np right after the saves (page cache warm, "
                               "destinations touched)");
  s.mgr.reset();
  if (!f.keep) RemoveAll(root);
  return r;
}

// restore: the latest step under --dir, laid out for this world size.
json RunRestore(const Flags& f) {
  const int rank = Rank(), size = Size();
  std::string root = ParentDir(f) + "/mhckpt-bench-sharded";
  if (!std::filesystem::is_directory(root)) root = ParentDir(f);
  Options o = MakeOptions(f);
  o.max_to_keep = 0;  // delete nothing
  auto mgr = OpenOrDie(root, o);
  Result<std::optional<int64_t>> latest = mgr->LatestStep();
  CheckOk(latest.status(), "latest step");
  if (!latest->has_value()) {
    CheckOk(NotFound(fmt::format("no committed step in {}", root)), "restore");
  }
  const int64_t step = **latest;
  Result<StepDescription> marker = mgr->Describe(step);
  CheckOk(marker.status(), "describe");

  // The layout: arrays the save split over its ranks are split over ours.
  std::set<std::string> sharded;
  auto it = marker->user_metadata.find(kShardedKey);
  const bool have_list = it != marker->user_metadata.end();
  if (have_list) {
    std::istringstream names(it->second);
    std::string name;
    while (std::getline(names, name, ',')) sharded.insert(name);
  }
  std::vector<ArraySpec> specs;
  uint64_t global = 0;
  for (const StoredArray& a : marker->arrays) {
    specs.push_back(
        {a.name, a.dtype, a.shape, have_list ? sharded.contains(a.name) : !a.replicated});
    global += ArrayBytes(specs.back());
  }
  double mib = MiB(static_cast<double>(global));
  if (auto m = marker->user_metadata.find(kMibKey); m != marker->user_metadata.end()) {
    mib = std::strtod(m->second.c_str(), nullptr);
  }

  RestoreRun v = RunRestores(*mgr, step, specs, f.reps, f.drop_caches, Dest::kFresh,
                             /*warmup=*/1, Restoring(f), f.dest_pages == "huge", f.perf_control);
  if (f.drop_caches && !v.drop_caches_ok && rank == 0) {
    fmt::print(stderr, "{}: cannot write /proc/sys/vm/drop_caches: the page cache stays warm\n",
               kProgram);
  }

  const bool resharded = marker->world_size != size;
  json r = Record(f, "sharded");
  r["mib"] = mib;
  r["restore_np"] = size;
  r["saved_np"] = marker->world_size;
  r["resharded"] = resharded;
  r["step"] = step;
  r["global_bytes"] = global;
  r["local_bytes_max"] = MaxOverRanksU64(v.local_bytes);
  r["n_arrays"] = v.arrays;
  r["restore_s"] = Median(v.restore);
  r["reshard_s"] = resharded ? json(Median(v.restore)) : json(nullptr);
  r["samples"]["restore_s"] = v.restore;
  r["peak_rss_extra_bytes"] = v.rss_extra;
  r["hwm_reset"] = v.hwm_reset;
  r["drop_caches"] = f.drop_caches;
  r["drop_caches_ok"] = f.drop_caches && v.drop_caches_ok;
  r["verify_checksums"] = !f.no_verify_checksums;
  r["prefault"] = f.prefault;
  r["direct_reads"] = f.direct_reads;
  r["direct_read_bytes"] = SumOverRanksU64(v.direct_bytes) / static_cast<uint64_t>(f.reps);
  r["dest_pages"] = f.dest_pages;
  r["format_version"] = marker->format_version;
  r["files"] = marker->files;
  r["file_bytes"] = FileBytes(root, step);
  r["verified"] = v.verified;
  r["root"] = root;
  r["notes"] = WithNote(
      f, fmt::format("restore_s: Restore() of the latest step into new, untouched arrays (a fresh "
                     "allocation per rep) laid out for np {}, saved at np {}, after one untimed "
                     "warm-up restore; reshard_s = restore_s when the world sizes differ; "
                     "page cache {}; per rep the slowest rank, median over reps; peak RSS "
                     "extra: over the destination arrays; destinations {}",
                     size, marker->world_size,
                     !f.drop_caches     ? "not dropped"
                     : v.drop_caches_ok ? "dropped before each rep"
                                        : "NOT dropped (drop_caches refused)",
                     DestPagesNote(f)));
  return r;
}

// Saves, then restores at the same world size, of `specs` (many, replicated).
json RunSaveRestore(const Flags& f, const std::string& kase, std::vector<ArraySpec> specs) {
  const int rank = Rank(), size = Size();
  long pid = rank == 0 ? static_cast<long>(getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::string root = fmt::format("{}/mhckpt-bench-{}-{}", ParentDir(f), kase, pid);
  Model m = Materialize(std::move(specs), rank, size);
  SaveRun s = RunSaves(f, m, root, MakeOptions(f), {});
  json r = Record(f, kase);
  AddSaves(r, s, m);
  r["file_bytes"] = FileBytes(root, s.last_step);

  RestoreRun v = RunRestores(*s.mgr, s.last_step, m.specs, f.reps, f.drop_caches, Dest::kFresh,
                             /*warmup=*/1, Restoring(f), f.dest_pages == "huge", f.perf_control);
  r["restore_peak_rss_extra_bytes"] = v.rss_extra;
  r["restore_np"] = size;
  r["restore_s"] = Median(v.restore);
  r["samples"]["restore_s"] = v.restore;
  r["drop_caches"] = f.drop_caches;
  r["drop_caches_ok"] = f.drop_caches && v.drop_caches_ok;
  r["prefault"] = f.prefault;
  r["direct_reads"] = f.direct_reads;
  r["direct_read_bytes"] = SumOverRanksU64(v.direct_bytes) / static_cast<uint64_t>(f.reps);
  r["dest_pages"] = f.dest_pages;
  r["verified"] = v.verified;
  r["notes"] = WithNote(f, std::string(kSaveNotes) +
                               "; restore_s: Restore() at the same np into new, untouched "
                               "arrays (a fresh allocation per rep) after one untimed warm-up "
                               "restore, each rep verified; destinations " +
                               DestPagesNote(f));
  s.mgr.reset();
  if (!f.keep) RemoveAll(root);
  return r;
}

json Run(const Flags& f) {
  json records = json::array();
  if (f.mode == "save") {
    records.push_back(RunSave(f));
  } else if (f.mode == "restore") {
    records.push_back(RunRestore(f));
  } else if (f.mode == "many") {
    std::vector<ArraySpec> many = ManySmallSpecs(f.mib, f.arrays);
    uint64_t bytes = 0;
    for (const ArraySpec& a : many) bytes += ArrayBytes(a);
    if (f.only_case != "one_array") {
      records.push_back(RunSaveRestore(f, "many_small", std::move(many)));
    }
    if (f.only_case != "many_small") {
      records.push_back(RunSaveRestore(f, "one_array", OneArraySpecs(bytes)));
    }
  } else {  // replicated
    records.push_back(RunSaveRestore(
        f, "replicated", TrainingStateSpecs(TrainingStateConfig{f.mib, f.small, true}, Size())));
  }
  return records;
}

std::string Ms(const json& s) {
  return s.is_null() ? std::string("       -") : fmt::format("{:8.1f}", s.get<double>() * 1e3);
}

void PrintTable(const json& records) {
  fmt::print("{:<11} {:>3} {:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {}\n", "case",
             "np", "rnp", "MiB", "local", "memcpy", "stall", "commit", "restore", "reshard", "+RSS",
             "verified");
  for (const json& r : records) {
    fmt::print("{:<11} {:>3} {:>4} {:9.1f} {:9.1f} {:>9} {:>9} {:>9} {:>9} {:>9} {:9.1f}  {}\n",
               r["case"].get<std::string>(), r["np"].get<int>(),
               r["restore_np"].is_null() ? std::string("-") : r["restore_np"].dump(),
               MiB(r["global_bytes"].get<double>()), MiB(r["local_bytes_max"].get<double>()),
               Ms(r.value("memcpy_s", json())), Ms(r["stall_s"]), Ms(r["commit_s"]),
               Ms(r["restore_s"]), Ms(r["reshard_s"]), MiB(r["peak_rss_extra_bytes"].get<double>()),
               r["verified"].get<bool>());
  }
  fmt::print("(times in ms, the slowest rank, median over reps; MiB global and local max)\n");
}

}  // namespace
}  // namespace mhckpt::bench

namespace {

// main() after MPI_Init; may throw (JSON, file system).
int Main(int argc, char** argv, int provided) {
  const int rank = mhckpt::bench::Rank();
  using mhckpt::bench::kProgram;

  mhckpt::bench::Flags f;
  CLI::App app{
      "End-to-end save, commit and restore figures of mhckpt, one JSON record per case "
      "(bench/run.sh). Run it under mpirun; see the top of bench/ckpt_bench.cc."};
  app.add_option("--mode", f.mode, "What to measure")
      ->required()
      ->check(CLI::IsMember({"save", "restore", "many", "replicated"}));
  app.add_option("--mib", f.mib,
                 "Total bytes in MiB: of the sharded state (save), of the 10,000 arrays (many), "
                 "per rank (replicated)")
      ->check(CLI::Range(1.0, 65536.0))
      ->capture_default_str();
  app.add_option("--reps", f.reps, "Timed repeats (medians)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--small", f.small, "Small arrays held whole (16 KiB each; save, replicated)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--arrays", f.arrays,
                 "Arrays of the many_small case (rounded to whole layers; 10,000 is exact)")
      ->check(CLI::Range(80, 1000000))
      ->capture_default_str();
  app.add_option("--threads", f.threads, "Options::snapshot_threads (0: the library's default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--transfer", f.transfer, "HDF5 transfer mode")
      ->check(CLI::IsMember({"independent", "collective"}))
      ->capture_default_str();
  app.add_option("--data-path", f.data_path, "Options::data_path (independent transfer)")
      ->check(CLI::IsMember({"direct", "buffered", "hdf5"}))
      ->capture_default_str();
  app.add_option("--writer-threads", f.writer_threads,
                 "Options::writer_threads (0: the library's default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--replica-split-bytes", f.replica_split_bytes,
                 "Options::replica_parallel_min_bytes (0: rank 0 writes replicated arrays)")
      ->capture_default_str();
  app.add_option("--dir", f.dir,
                 "Where checkpoints go (save: DIR/mhckpt-bench-sharded; restore reads it, or DIR "
                 "itself; default $TMPDIR or /tmp)");
  app.add_option("--json", f.json_path, "Write the records as a JSON list to this file");
  app.add_option("--version-tag", f.version_tag,
                 "The \"version\" field (default: git describe of the source tree)");
  app.add_option("--launcher", f.launcher, "The \"launcher\" field")->capture_default_str();
  app.add_option("--note", f.note, "Appended to the \"notes\" field");
  app.add_flag("--keep", f.keep, "Keep the checkpoints written (save: for a later restore)");
  app.add_option("--chunk-bytes", f.chunk_bytes,
                 "Options::checksum_chunk_bytes of the saves (0: the library's default)");
  app.add_option("--format", f.format,
                 "Options::format_version of the saves (0: the library's default)");
  app.add_option("--ranks-per-file", f.ranks_per_file,
                 "Options::files: 0, one data file; -1, a subfile per node; k, a subfile per k "
                 "ranks");
  app.add_option("--dest-pages", f.dest_pages,
                 "restore, many: new destinations advised MADV_HUGEPAGE as numpy advises its "
                 "arrays (huge), or not (base)")
      ->check(CLI::IsMember({"huge", "base"}))
      ->capture_default_str();
  app.add_option("--prefault", f.prefault, "restore, many: RestoreOptions::prefault")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--direct-reads", f.direct_reads, "restore, many: RestoreOptions::direct_reads")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_flag("--no-verify-checksums", f.no_verify_checksums,
               "restore: RestoreOptions::verify_checksums = false (the bytes are still compared)");
  app.add_option("--case", f.only_case, "many: run this case only")
      ->check(CLI::IsMember({"many_small", "one_array"}));
  app.add_option("--perf-control", f.perf_control,
                 "CTL,ACK: around each timed restore, rank 0 writes enable and disable to "
                 "`perf record -D -1 --control fifo:CTL,ACK`, so the profile holds the restores "
                 "alone");
  app.add_flag("--drop-caches", f.drop_caches,
               "Before each restore, rank 0 syncs and writes 1 to /proc/sys/vm/drop_caches");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = rank == 0 ? app.exit(e) : e.get_exit_code();
    MPI_Finalize();
    return rc;
  }
  if (provided != MPI_THREAD_MULTIPLE && rank == 0) {
    fmt::print(stderr, "{}: MPI gave thread level {} (not MULTIPLE): saves commit inside Save\n",
               kProgram, provided);
  }

  nlohmann::json records = mhckpt::bench::Run(f);
  int rc = 0;
  for (const nlohmann::json& r : records) {
    if (!r["verified"].get<bool>()) rc = 2;
  }
  if (rank == 0) {
    mhckpt::bench::PrintTable(records);
    if (rc != 0) fmt::print(stderr, "{}: restored bytes differ from the saved ones\n", kProgram);
    if (!f.json_path.empty()) {
      std::ofstream out(f.json_path);
      out << records.dump(2) << "\n";
      if (!out) {
        fmt::print(stderr, "{}: cannot write {}\n", kProgram, f.json_path);
        rc = rc != 0 ? rc : 1;
      }
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  return mhckpt::GuardedMain("mhckpt-bench", [&] {
    mhckpt::bench::g_version = mhckpt::bench::GitDescribe();
    int provided = MPI_THREAD_SINGLE;
    // MULTIPLE: saves commit on the background I/O thread, as in training.
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    return Main(argc, argv, provided);
  });
}
