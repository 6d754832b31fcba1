// A real training-like job for the crash tests (tests/crash_test.py), run
// under mpirun and killed from inside (MHCKPT_FAULT) or from outside (SIGKILL):
//
//   crash_job save  DIR FIRST LAST [--max-to-keep K] [--rows R]
//       saves steps FIRST..LAST, waiting for each; rank 0 prints
//       "committed S" after each step that WaitUntilFinished reported OK
//   crash_job loop  DIR [--rows R] [--max-steps N]
//       saves latest+1, latest+2, ... until killed (or N steps), each waited
//   crash_job check DIR [--steps all|none|S,S,S-,...] [--rows R]
//       lists the step directories, opens the root (which removes uncommitted
//       steps), lists the committed steps, restores the chosen committed steps
//       (default: all; "S-" is every committed step from S on) at this world
//       size with a sharding other than the save's, compares every byte, calls
//       Verify on each, and prints one line "CRASHCHECK {json}" (rank 0).
//       Exits 1 on any mismatch or failure.
//
// Every mode also takes the local tier's options (Options::local_dir):
//   --local-dir BASE      turns it on; nodes are simulated on this machine:
//                         rank R is on node R / K (Options::node_id) and its
//                         node's local dir is BASE/node<R / K>
//   --ranks-per-node K    (default 1)
//   --persistent-every N  Options::persistent_every (default 1)
//   --ranks-per-file K    Options::files: a subfile per K ranks (default 0: one file)
//   --tier auto|local|persistent   SaveOptions::tier of every save (default auto)
// With it, check restores each chosen step from the tier the manager picks
// (the local one if it holds the step), and a step that the shared root holds
// too also from the shared root (RestoreSource::kPersistent); Verify runs on
// the steps the shared root holds (it reads the shared root). The report adds
// "tiers": {step: "local" | "persistent" | "both"} and "world_size_at_save":
// {step: world size} (Describe).
//
// The state is a few sharded and replicated arrays whose contents depend only
// on the step (and --rows), so any later job can predict every byte. Every rank
// of save and loop writes its pid to DIR/../pids/rank<R> (atomically), so that
// an outside killer can pick a rank.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "coordinator/checkpoint_manager.h"
#include "io/catalog.h"
#include "io/layout.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

namespace fs = std::filesystem;
using testing::Fill;
using testing::OpenAgreed;

struct Args {
  std::string mode, dir;
  int64_t first = 0, last = 0;
  int max_to_keep = 0;
  int64_t rows = 2048;  // rows of params/w (1 KiB each); the state scales with it
  int64_t max_steps = -1;
  std::string steps = "all";
  std::string local_dir;  // "": one tier
  int ranks_per_node = 1;
  int persistent_every = 1;
  SaveTier tier = SaveTier::kAuto;
  int ranks_per_file = 0;  // Options::files
};

// The manager's options for rank r: the local tier's, if asked for.
Options MakeOptions(const Args& a, int r) {
  Options o;
  o.max_to_keep = a.max_to_keep;
  o.files.ranks_per_file = a.ranks_per_file;
  if (!a.local_dir.empty()) {
    const int node = r / a.ranks_per_node;
    o.local_dir = fmt::format("{}/node{}", a.local_dir, node);
    o.node_id = node;
    o.persistent_every = a.persistent_every;
  }
  return o;
}

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// The arrays of one step. Sorted by name is not required; the manager sorts.
std::vector<Spec> Specs(int64_t rows) {
  return {
      {"params/w", DType::kFloat32, {rows, 256}},             // rows split unevenly
      {"params/emb", DType::kBFloat16, {rows / 8 + 3, 130}},  // 2-D block grid
      {"opt/dp", DType::kFloat64, {rows / 4 + 1, 64}},        // data-parallel copies of 2 parts
      {"replicated/bias", DType::kFloat32, {77}},             // every rank holds all of it
      {"replicated/step", DType::kInt64, {}},                 // the step itself
  };
}

// The expected bytes of `box` of array `k` at `step`.
std::vector<std::byte> Expected(const Spec& s, size_t k, const Box& box, int64_t step) {
  if (s.name == "replicated/step") {
    std::vector<std::byte> out(8);
    std::memcpy(out.data(), &step, 8);
    return out;
  }
  return Fill(s.dtype, s.shape, box, static_cast<uint64_t>(step) * 16 + k);
}

Box Rows(const std::vector<int64_t>& shape, int64_t b, int64_t e) {
  Box box = FullBox(shape);
  box.start[0] = b;
  box.count[0] = e - b;
  return box;
}

// 4 -> 2x2, otherwise p x 1.
std::pair<int, int> Grid(int p) { return p == 4 ? std::pair{2, 2} : std::pair{p, 1}; }

// The boxes rank r of p holds when saving.
std::vector<Box> SaveBoxes(const Spec& s, int p, int r) {
  if (s.name == "params/w") {
    auto [b, e] = SplitRange(s.shape[0], p, r);
    return {Rows(s.shape, b, e)};
  }
  if (s.name == "params/emb") {
    auto [gx, gy] = Grid(p);
    auto [x0, x1] = SplitRange(s.shape[0], gx, r / gy);
    auto [y0, y1] = SplitRange(s.shape[1], gy, r % gy);
    return {Box{{x0, y0}, {x1 - x0, y1 - y0}}};
  }
  if (s.name == "opt/dp") {  // two model-parallel parts, each held by every other rank
    if (p == 1) return {FullBox(s.shape)};
    auto [b, e] = SplitRange(s.shape[0], 2, r % 2);
    return {Rows(s.shape, b, e)};
  }
  return {FullBox(s.shape)};
}

// The boxes rank r of p asks for when checking: never the save's layout.
std::vector<Box> CheckBoxes(const Spec& s, int p, int r) {
  if (s.name == "params/w" || s.name == "params/emb") {  // columns, two boxes per rank
    const int parts = 2 * p;
    std::vector<Box> out;
    for (int part : {r, parts - 1 - r}) {
      auto [b, e] = SplitRange(s.shape[1], parts, part);
      Box box = FullBox(s.shape);
      box.start[1] = b;
      box.count[1] = e - b;
      out.push_back(box);
    }
    return out;
  }
  if (s.name == "opt/dp") {  // rows in p + 1 parts, reversed; rank 0 takes two
    std::vector<Box> out;
    for (int part = 0; part <= p; ++part) {
      if (part % p != r) continue;
      auto [b, e] = SplitRange(s.shape[0], p + 1, p - part);
      out.push_back(Rows(s.shape, b, e));
    }
    return out;
  }
  return {FullBox(s.shape)};
}

void WritePid(const std::string& dir, int r) {
  fs::path pids = fs::path(dir).parent_path() / "pids";
  fs::create_directories(pids);
  std::string tmp = (pids / fmt::format(".rank{}.tmp", r)).string();
  std::ofstream(tmp) << getpid() << "\n";
  fs::rename(tmp, pids / fmt::format("rank{}", r));
}

Status SaveStep(CheckpointManager& mgr, int64_t step, int64_t rows, int p, int r, SaveTier tier) {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToSave> arrays;
  std::vector<Spec> specs = Specs(rows);
  for (size_t k = 0; k < specs.size(); ++k) {
    const Spec& s = specs[k];
    ArrayToSave a{s.name, s.dtype, s.shape, {}};
    for (const Box& b : SaveBoxes(s, p, r)) {
      bufs.push_back(Expected(s, k, b, step));
      a.shards.push_back(Shard{b, bufs.back().data()});
    }
    arrays.push_back(std::move(a));
  }
  Status st = mgr.Save(step, arrays, {{"writer", "crash_job"}}, SaveOptions{.tier = tier});
  for (auto& b : bufs) std::memset(b.data(), 0xEE, b.size());  // Save has copied them
  Status waited = mgr.WaitUntilFinished();
  return st.ok() ? waited : st;
}

int SaveOrLoop(const Args& a, int p, int r) {
  WritePid(a.dir, r);
  auto mgr = OpenAgreed(a.dir, MakeOptions(a, r));
  if (!mgr.ok()) return fmt::print(stderr, "rank {}: open: {}\n", r, mgr.status().ToString()), 1;
  int64_t first = a.first, last = a.last;
  if (a.mode == "loop") {
    auto latest = (*mgr)->LatestStep();
    if (!latest.ok()) return fmt::print(stderr, "rank {}: list failed\n", r), 1;
    // Every rank lists the same directory, but agree anyway: the loop's exit
    // must be decided alike everywhere.
    int64_t next = latest->value_or(0) + 1;
    MPI_Bcast(&next, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    first = next;
    last = a.max_steps < 0 ? INT64_MAX : next + a.max_steps - 1;
  }
  for (int64_t step = first; step <= last; ++step) {
    Status st = SaveStep(**mgr, step, a.rows, p, r, a.tier);
    if (!st.ok()) {
      fmt::print(stderr, "rank {}: step {}: {}\n", r, step, st.ToString());
      return 1;  // the same Status on every rank: all leave together
    }
    if (r == 0) {
      fmt::print("committed {}\n", step);
      std::fflush(stdout);
    }
  }
  return 0;
}

struct StepResult {
  int64_t step;
  bool restored = false, verified = false;
  std::string error;
  uint64_t bytes = 0;
};

// Collective: restores `step` from `source` with the check sharding and
// compares every byte; returns "" or what went wrong, adds the bytes compared
// (over all ranks) to `compared`.
std::string RestoreStep(CheckpointManager& mgr, int64_t step, int64_t rows, int p, int r,
                        RestoreSource source, uint64_t* compared) {
  std::vector<Spec> specs = Specs(rows);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToRestore> arrays;
  for (const Spec& s : specs) {
    ArrayToRestore a{s.name, s.dtype, {}};
    for (const Box& b : CheckBoxes(s, p, r)) {
      bufs.emplace_back(static_cast<size_t>(*Volume(b.count)) * DTypeSize(s.dtype),
                        std::byte{0x5A});
      a.shards.push_back(Destination{b, bufs.back().data()});
    }
    arrays.push_back(std::move(a));
  }
  Status st = mgr.Restore(step, arrays, RestoreOptions{.strict = true, .source = source});
  int bad = 0;
  uint64_t bytes = 0;
  std::string first_bad;
  if (st.ok()) {
    size_t i = 0;
    for (size_t k = 0; k < specs.size(); ++k) {
      for (const Box& b : CheckBoxes(specs[k], p, r)) {
        if (Expected(specs[k], k, b, step) != bufs[i] && bad++ == 0) {
          first_bad =
              fmt::format("rank {}: array '{}' box {} differs", r, specs[k].name, BoxToString(b));
        }
        bytes += bufs[i++].size();
      }
    }
  }
  int all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  *compared += testing::SumOverRanks(bytes);
  if (!st.ok()) return "restore: " + st.ToString();
  if (all_bad > 0) {
    if (!first_bad.empty()) fmt::print(stderr, "step {}: {}\n", step, first_bad);
    return fmt::format("{} boxes differ", all_bad);
  }
  return "";
}

// Collective: restores `step` and compares every byte — from the tier the
// manager picks, and also from the shared root if both tiers hold it — then
// verifies it if the shared root holds it (Verify reads the shared root).
// `tiers` is rank 0's (the tiers' view is the same on every rank).
StepResult CheckStep(CheckpointManager& mgr, int64_t step, int64_t rows, int p, int r,
                     const CheckpointManager::StepTiers& tiers) {
  StepResult out{step};
  std::vector<std::pair<RestoreSource, std::string>> sources{{RestoreSource::kAny, ""}};
  if (tiers.local && tiers.persistent) {
    sources.emplace_back(RestoreSource::kPersistent, "from the shared root: ");
  }
  for (const auto& [source, what] : sources) {
    std::string e = RestoreStep(mgr, step, rows, p, r, source, &out.bytes);
    if (!e.empty()) out.error += (out.error.empty() ? "" : "; ") + what + e;
  }
  out.restored = out.error.empty();
  if (!tiers.persistent) {
    out.verified = out.restored;
    return out;
  }
  Status v = mgr.Verify(step);
  if (v.ok()) {
    out.verified = true;
  } else if (out.error.empty()) {
    out.error = "verify: " + v.ToString();
  } else {
    out.error += "; verify: " + v.ToString();
  }
  return out;
}

std::vector<int64_t> StepDirsOnDisk(const std::string& root) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (auto s = io::ParseStepDirName(e.path().filename().string())) out.push_back(*s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int Check(const Args& a, int p, int r) {
  nlohmann::json report;
  report["np"] = p;
  if (r == 0) {  // what a crash left, before Open cleans up
    nlohmann::json before = nlohmann::json::array();
    auto listed = io::ListSteps(a.dir);
    for (const io::StepEntry& e : listed.ok() ? *listed : std::vector<io::StepEntry>{}) {
      std::string d = io::StepDir(a.dir, e.step);
      before.push_back({{"step", e.step},
                        {"committed", e.committed},
                        {"marker_error", e.marker.ok() ? "" : e.marker.ToString()},
                        {"marker_tmp", fs::exists(d + "/commit.json.tmp")},
                        {"data", fs::exists(io::DataPath(a.dir, e.step))}});
    }
    report["before_open"] = before;
  }
  MPI_Barrier(MPI_COMM_WORLD);  // nobody opens (and cleans) before rank 0 has looked
  auto mgr = OpenAgreed(a.dir, MakeOptions(a, r));
  if (!mgr.ok()) return fmt::print(stderr, "rank {}: open: {}\n", r, mgr.status().ToString()), 1;
  // Rank 0's list, so that every rank runs the same collectives: per step,
  // the step and its tiers (bit 0: shared root, bit 1: local tier).
  std::vector<int64_t> listed;
  if (r == 0) {
    auto c = (*mgr)->Steps();
    if (c.ok()) {
      for (const auto& t : *c) listed.insert(listed.end(), {t.step, t.persistent + 2 * t.local});
    }
    report["dirs_after_open"] = StepDirsOnDisk(a.dir);
  }
  int64_t n = static_cast<int64_t>(listed.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  listed.resize(static_cast<size_t>(n));
  MPI_Bcast(listed.data(), static_cast<int>(n), MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::vector<int64_t> committed;
  std::map<int64_t, CheckpointManager::StepTiers> tiers;
  nlohmann::json tier_names = nlohmann::json::object();
  for (size_t i = 0; i + 1 < listed.size(); i += 2) {
    const int64_t step = listed[i];
    const bool persistent = (listed[i + 1] & 1) != 0, local = (listed[i + 1] & 2) != 0;
    committed.push_back(step);
    tiers[step] = {step, persistent, local};
    tier_names[std::to_string(step)] = persistent && local ? "both"
                                       : local             ? "local"
                                                           : "persistent";
  }
  if (!a.local_dir.empty() && r == 0) {  // which save of each step this job sees
    nlohmann::json saved_at = nlohmann::json::object();
    for (int64_t step : committed) {
      auto d = (*mgr)->Describe(step);
      saved_at[std::to_string(step)] = d.ok() ? d->world_size : -1;
    }
    report["world_size_at_save"] = saved_at;
  }
  if (!a.local_dir.empty()) report["tiers"] = tier_names;

  std::vector<int64_t> chosen;
  if (a.steps == "all") {
    chosen = committed;
  } else if (!a.steps.empty() && a.steps != "none") {
    size_t pos = 0;
    while (pos <= a.steps.size()) {
      size_t e = a.steps.find(',', pos);
      if (e == std::string::npos) e = a.steps.size();
      std::string item = a.steps.substr(pos, e - pos);
      pos = e + 1;
      if (item.empty()) continue;
      const bool and_above = item.back() == '-';  // "S-": every committed step from S on
      int64_t s = std::stoll(and_above ? item.substr(0, item.size() - 1) : item);
      for (int64_t c : committed) {
        if (c == s || (and_above && c > s)) chosen.push_back(c);
      }
    }
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  }
  nlohmann::json ok = nlohmann::json::array(), failed = nlohmann::json::object();
  uint64_t bytes = 0;
  for (int64_t step : chosen) {
    StepResult res = CheckStep(**mgr, step, a.rows, p, r, tiers[step]);
    bytes += res.bytes;
    if (res.error.empty())
      ok.push_back(step);
    else
      failed[std::to_string(step)] = res.error;
  }
  report["committed"] = committed;
  report["checked_ok"] = ok;
  report["failed"] = failed;
  report["bytes_compared"] = bytes;
  if (r == 0) {
    fmt::print("CRASHCHECK {}\n", report.dump());
    std::fflush(stdout);
  }
  return failed.empty() ? 0 : 1;
}

std::optional<Args> ParseArgs(int argc, char** argv) {
  if (argc < 3) return std::nullopt;
  Args a;
  a.mode = argv[1];
  a.dir = argv[2];
  int i = 3;
  if (a.mode == "save") {
    if (argc < 5) return std::nullopt;
    a.first = std::stoll(argv[3]);
    a.last = std::stoll(argv[4]);
    i = 5;
  } else if (a.mode != "loop" && a.mode != "check") {
    return std::nullopt;
  }
  for (; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--max-to-keep")
      a.max_to_keep = std::stoi(v);
    else if (k == "--rows")
      a.rows = std::stoll(v);
    else if (k == "--max-steps")
      a.max_steps = std::stoll(v);
    else if (k == "--steps")
      a.steps = v;
    else if (k == "--local-dir")
      a.local_dir = v;
    else if (k == "--ranks-per-node")
      a.ranks_per_node = std::stoi(v);
    else if (k == "--persistent-every")
      a.persistent_every = std::stoi(v);
    else if (k == "--ranks-per-file")
      a.ranks_per_file = std::stoi(v);
    else if (k == "--tier" && (v == "auto" || v == "local" || v == "persistent"))
      a.tier = v == "auto"    ? SaveTier::kAuto
               : v == "local" ? SaveTier::kLocal
                              : SaveTier::kPersistent;
    else
      return std::nullopt;
  }
  if (i != argc || a.rows < 8 || a.ranks_per_node < 1) return std::nullopt;
  return a;
}

}  // namespace
}  // namespace mhckpt

int main(int argc, char** argv) {
  return mhckpt::testing::RunJob(argc, argv, [](int argc, char** argv, int p, int r) {
    int rc = 2;
    auto args = mhckpt::ParseArgs(argc, argv);
    if (!args) {
      if (r == 0) {
        std::fprintf(stderr,
                     "usage: crash_job save DIR FIRST LAST [--max-to-keep K] [--rows R]\n"
                     "       crash_job loop DIR [--rows R] [--max-steps N]\n"
                     "       crash_job check DIR [--steps all|none|S,S,S-,...] [--rows R]\n"
                     "  any mode: [--local-dir BASE [--ranks-per-node K] [--persistent-every N]\n"
                     "             [--tier auto|local|persistent]]\n");
      }
    } else if (args->mode == "check") {
      rc = mhckpt::Check(*args, p, r);
    } else {
      rc = mhckpt::SaveOrLoop(*args, p, r);
    }
    return rc;
  });
}
