// The job the crash-state explorer records and the checker it runs on every
// state it builds (tests/crashstate/explore.py, docs/RELIABILITY.md
// "Crash states"). Public API only.
//
//   state_job save  ROOT FIRST LAST [options]
//       saves steps FIRST..LAST (each waited for) of a small state whose every
//       byte depends only on the step and R: a float32 matrix split by rows, a
//       float64 matrix split by columns, a replicated vector (rank 0 writes
//       it) and the step as an int64 scalar.
//   state_job check LIST [options]
//       LIST names one root per line. For each, every rank: Open (which
//       removes uncommitted steps), Steps, then for every committed step a
//       Restore at this world size (rows split across the ranks, so a world
//       size other than the save's is a reshard) compared byte for byte with
//       the expected values, and a Verify. Rank 0 prints one line per root:
//       CHECK {"root":..,"open":"OK"|error,"committed":[..],"local":[..],
//       "steps":{"S":{"restore":"OK"|error|"-","verify":"OK"|error|"-",
//       "local_restore":"OK"|error|"-"}}}: "committed" lists the shared
//       root's steps, "local" the local tier's (Steps().local); a step is
//       restored from each tier that lists it (RestoreSource), "-" where it
//       is not listed. It reports facts; explore.py decides what is a
//       violation.
//
//   Options (the same for save and check):
//     --rows R             the state's size (512)
//     --max-to-keep K      Options::max_to_keep (save)
//     --collective         Transfer::kCollective (save)
//     --files K            Options::files = DataFiles::PerRanks(K): subfiles
//     --format V           Options::format_version (3)
//     --local              the local tier on: ROOT is a directory holding the
//                          shared root, ROOT/shared, and one local dir per
//                          node, ROOT/local/n<k>; saves go to the local tier
//                          only (SaveTier::kLocal)
//     --nodes N            nodes simulated by Options::node_id: rank r of p
//                          is on node r*N/p (2)
//     --copies C           Options::local_copies (1)
//     --parity G           Options::local_parity_group (0)
//     --local-keep K       Options::local_max_to_keep (2)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

std::vector<Spec> Specs(int64_t rows) {
  return {
      {"params/w", DType::kFloat32, {rows, 64}},
      {"params/v", DType::kFloat64, {rows / 4 + 3, 40}},
      {"replicated/scale", DType::kFloat32, {33}},
      {"replicated/step", DType::kInt64, {}},
  };
}

std::vector<std::byte> Expected(const Spec& s, size_t k, const Box& box, int64_t step) {
  if (s.name == "replicated/step") {
    std::vector<std::byte> out(8);
    std::memcpy(out.data(), &step, 8);
    return out;
  }
  return Fill(s.dtype, s.shape, box, static_cast<uint64_t>(step) * 16 + k);
}

// Dimension `dim` of `shape` cut into p parts; part r.
Box Part(const std::vector<int64_t>& shape, int dim, int p, int r) {
  Box box = FullBox(shape);
  if (shape.empty()) return box;
  auto [b, e] = SplitRange(shape[dim], p, r);
  box.start[dim] = b;
  box.count[dim] = e - b;
  return box;
}

Box SaveBox(const Spec& s, int p, int r) {
  if (s.name == "params/w") return Part(s.shape, 0, p, r);
  if (s.name == "params/v") return Part(s.shape, 1, p, r);
  return FullBox(s.shape);
}

struct Args {
  std::string mode, path;
  int64_t first = 0, last = 0, rows = 512;
  int max_to_keep = 0;
  bool collective = false;
  int files = 0, format = 3;
  bool local = false;
  int nodes = 2, copies = 1, parity = 0, local_keep = 2;
};

// The shared root of `path` and, with --local, this rank's node and local dir.
std::string SharedRoot(const Args& a, const std::string& path) {
  return a.local ? path + "/shared" : path;
}

void SetTiers(const Args& a, const std::string& path, int p, int r, Options* o) {
  o->files = DataFiles::PerRanks(a.files);
  o->format_version = a.format;
  if (!a.local) return;
  o->node_id = static_cast<int>(static_cast<int64_t>(r) * a.nodes / p);
  o->local_dir = fmt::format("{}/local/n{}", path, o->node_id);
  o->local_copies = a.copies;
  o->local_parity_group = a.parity;
  o->local_max_to_keep = a.local_keep;
}

Status SaveStep(CheckpointManager& mgr, int64_t step, int64_t rows, int p, int r, bool local) {
  std::vector<Spec> specs = Specs(rows);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToSave> arrays;
  for (size_t k = 0; k < specs.size(); ++k) {
    const Box box = SaveBox(specs[k], p, r);
    bufs.push_back(Expected(specs[k], k, box, step));
    arrays.push_back(ArrayToSave{
        specs[k].name, specs[k].dtype, specs[k].shape, {Shard{box, bufs.back().data()}}});
  }
  SaveOptions so;
  if (local) so.tier = SaveTier::kLocal;
  Status st = mgr.Save(step, arrays, {{"writer", "state_job"}}, so);
  Status waited = mgr.WaitUntilFinished();
  return st.ok() ? waited : st;
}

int Save(const Args& a, int p, int r) {
  Options o;
  o.max_to_keep = a.max_to_keep;
  o.transfer = a.collective ? Transfer::kCollective : Transfer::kIndependent;
  SetTiers(a, a.path, p, r, &o);
  auto mgr = testing::OpenAgreed(SharedRoot(a, a.path), o);
  if (!mgr.ok()) return fmt::print(stderr, "rank {}: open: {}\n", r, mgr.status().ToString()), 1;
  for (int64_t step = a.first; step <= a.last; ++step) {
    Status st = SaveStep(**mgr, step, a.rows, p, r, a.local);
    if (!st.ok()) return fmt::print(stderr, "rank {}: step {}: {}\n", r, step, st.ToString()), 1;
    if (r == 0) fmt::print("committed {}\n", step);
  }
  return 0;
}

// Collective: restores `step` (rows split across the ranks) and compares.
std::string RestoreAndCompare(CheckpointManager& mgr, int64_t step, int64_t rows, int p, int r,
                              RestoreSource source) {
  std::vector<Spec> specs = Specs(rows);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToRestore> arrays;
  for (const Spec& s : specs) {
    const Box box = Part(s.shape, 0, p, r);
    bufs.emplace_back(static_cast<size_t>(*Volume(box.count)) * DTypeSize(s.dtype),
                      std::byte{0x5A});
    arrays.push_back(ArrayToRestore{s.name, s.dtype, {Destination{box, bufs.back().data()}}});
  }
  Status st = mgr.Restore(step, arrays, RestoreOptions{.strict = true, .source = source});
  int bad = 0;
  for (size_t k = 0; st.ok() && k < specs.size(); ++k) {
    if (Expected(specs[k], k, Part(specs[k].shape, 0, p, r), step) != bufs[k]) ++bad;
  }
  int all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (!st.ok()) return st.ToString();
  if (all_bad > 0) return fmt::format("restored bytes differ in {} boxes", all_bad);
  return "OK";
}

nlohmann::json CheckRoot(const Args& a, const std::string& root, int p, int r) {
  const int64_t rows = a.rows;
  nlohmann::json out{{"root", root}};
  Options o;
  o.collective_timeout_seconds = 120;
  SetTiers(a, root, p, r, &o);
  auto mgr = testing::OpenAgreed(SharedRoot(a, root), o);
  out["open"] = mgr.ok() ? "OK" : mgr.status().ToString();
  if (!mgr.ok()) return out;
  auto steps = (*mgr)->Steps();
  // Every rank must see the same list before the collective calls below:
  // each step and its tiers, encoded as 4*step + 2*persistent + local.
  std::vector<int64_t> code;
  if (steps.ok()) {
    for (const CheckpointManager::StepTiers& t : *steps) {
      code.push_back(4 * t.step + 2 * int64_t{t.persistent} + int64_t{t.local});
    }
  }
  int64_t n = steps.ok() ? static_cast<int64_t>(code.size()) : -1;
  int64_t n0 = n;
  MPI_Bcast(&n0, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::vector<int64_t> code0 = code;
  code0.resize(static_cast<size_t>(std::max<int64_t>(n0, 0)));
  MPI_Bcast(code0.data(), static_cast<int>(code0.size()), MPI_INT64_T, 0, MPI_COMM_WORLD);
  int differ = n != n0 || code != code0, any_differ = 0;
  MPI_Allreduce(&differ, &any_differ, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!steps.ok() || any_differ) {
    out["open"] = steps.ok() ? "ranks list different steps" : steps.status().ToString();
    return out;
  }
  std::vector<int64_t> persistent, local;
  for (const CheckpointManager::StepTiers& t : *steps) {
    if (t.persistent) persistent.push_back(t.step);
    if (t.local) local.push_back(t.step);
  }
  out["committed"] = persistent;
  out["local"] = local;
  out["steps"] = nlohmann::json::object();
  for (const CheckpointManager::StepTiers& t : *steps) {
    nlohmann::json j{{"restore", "-"}, {"verify", "-"}, {"local_restore", "-"}};
    if (t.persistent) {
      j["restore"] = RestoreAndCompare(**mgr, t.step, rows, p, r, RestoreSource::kPersistent);
      Status v = (*mgr)->Verify(t.step);
      j["verify"] = v.ok() ? "OK" : v.ToString();
    }
    if (t.local) {
      j["local_restore"] = RestoreAndCompare(**mgr, t.step, rows, p, r, RestoreSource::kLocal);
    }
    out["steps"][std::to_string(t.step)] = j;
  }
  return out;
}

int Check(const Args& a, int p, int r) {
  std::ifstream list(a.path);
  if (!list) return fmt::print(stderr, "cannot read '{}'\n", a.path), 1;
  std::string root;
  while (std::getline(list, root)) {
    if (root.empty()) continue;
    nlohmann::json j = CheckRoot(a, root, p, r);
    if (r == 0) {
      fmt::print("CHECK {}\n", j.dump());
      std::fflush(stdout);
    }
  }
  return 0;
}

int Main(int argc, char** argv, int p, int r) {
  Args a;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--rows" && i + 1 < argc) {
      a.rows = std::stoll(argv[++i]);
    } else if (s == "--max-to-keep" && i + 1 < argc) {
      a.max_to_keep = std::stoi(argv[++i]);
    } else if (s == "--collective") {
      a.collective = true;
    } else if (s == "--files" && i + 1 < argc) {
      a.files = std::stoi(argv[++i]);
    } else if (s == "--format" && i + 1 < argc) {
      a.format = std::stoi(argv[++i]);
    } else if (s == "--local") {
      a.local = true;
    } else if (s == "--nodes" && i + 1 < argc) {
      a.nodes = std::stoi(argv[++i]);
    } else if (s == "--copies" && i + 1 < argc) {
      a.copies = std::stoi(argv[++i]);
    } else if (s == "--parity" && i + 1 < argc) {
      a.parity = std::stoi(argv[++i]);
    } else if (s == "--local-keep" && i + 1 < argc) {
      a.local_keep = std::stoi(argv[++i]);
    } else {
      pos.push_back(s);
    }
  }
  if (pos.size() == 4 && pos[0] == "save") {
    a.mode = pos[0];
    a.path = pos[1];
    a.first = std::stoll(pos[2]);
    a.last = std::stoll(pos[3]);
    return Save(a, p, r);
  }
  if (pos.size() == 2 && pos[0] == "check") {
    a.path = pos[1];
    return Check(a, p, r);
  }
  if (r == 0) {
    fmt::print(stderr,
               "usage: state_job save ROOT FIRST LAST [options]\n"
               "       state_job check LIST [options]\n"
               "options: --rows R --max-to-keep K --collective --files K --format V --local "
               "--nodes N --copies C --parity G --local-keep K\n");
  }
  return 2;
}

}  // namespace
}  // namespace mhckpt

int main(int argc, char** argv) { return mhckpt::testing::RunJob(argc, argv, mhckpt::Main); }
