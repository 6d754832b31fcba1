// The job the crash-state explorer records and the checker it runs on every
// state it builds (tests/crashstate/explore.py, docs/RELIABILITY.md
// "Crash states"). Public API only.
//
//   state_job save  ROOT FIRST LAST [--rows R] [--max-to-keep K] [--collective]
//       saves steps FIRST..LAST (each waited for) of a small state whose every
//       byte depends only on the step and R: a float32 matrix split by rows, a
//       float64 matrix split by columns, a replicated vector (rank 0 writes
//       it) and the step as an int64 scalar.
//   state_job check LIST [--rows R]
//       LIST names one root per line. For each, every rank: Open (which
//       removes uncommitted steps), CommittedSteps, then for every committed
//       step a Restore at this world size (rows split across the ranks, so a
//       world size other than the save's is a reshard) compared byte for byte
//       with the expected values, and a Verify. Rank 0 prints one line per
//       root: CHECK {"root":..,"open":"OK"|error,"committed":[..],
//       "steps":{"S":{"restore":"OK"|error,"verify":"OK"|error}}}.
//       It reports facts; explore.py decides what is a violation.
#include <mpi.h>

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
};

Status SaveStep(CheckpointManager& mgr, int64_t step, int64_t rows, int p, int r) {
  std::vector<Spec> specs = Specs(rows);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToSave> arrays;
  for (size_t k = 0; k < specs.size(); ++k) {
    const Box box = SaveBox(specs[k], p, r);
    bufs.push_back(Expected(specs[k], k, box, step));
    arrays.push_back(ArrayToSave{
        specs[k].name, specs[k].dtype, specs[k].shape, {Shard{box, bufs.back().data()}}});
  }
  Status st = mgr.Save(step, arrays, {{"writer", "state_job"}});
  Status waited = mgr.WaitUntilFinished();
  return st.ok() ? waited : st;
}

int Save(const Args& a, int p, int r) {
  Options o;
  o.max_to_keep = a.max_to_keep;
  o.transfer = a.collective ? Transfer::kCollective : Transfer::kIndependent;
  auto mgr = testing::OpenAgreed(a.path, o);
  if (!mgr.ok()) return fmt::print(stderr, "rank {}: open: {}\n", r, mgr.status().ToString()), 1;
  for (int64_t step = a.first; step <= a.last; ++step) {
    Status st = SaveStep(**mgr, step, a.rows, p, r);
    if (!st.ok()) return fmt::print(stderr, "rank {}: step {}: {}\n", r, step, st.ToString()), 1;
    if (r == 0) fmt::print("committed {}\n", step);
  }
  return 0;
}

// Collective: restores `step` (rows split across the ranks) and compares.
std::string RestoreAndCompare(CheckpointManager& mgr, int64_t step, int64_t rows, int p, int r) {
  std::vector<Spec> specs = Specs(rows);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToRestore> arrays;
  for (const Spec& s : specs) {
    const Box box = Part(s.shape, 0, p, r);
    bufs.emplace_back(static_cast<size_t>(*Volume(box.count)) * DTypeSize(s.dtype),
                      std::byte{0x5A});
    arrays.push_back(ArrayToRestore{s.name, s.dtype, {Destination{box, bufs.back().data()}}});
  }
  Status st = mgr.Restore(step, arrays, RestoreOptions{.strict = true});
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

nlohmann::json CheckRoot(const std::string& root, int64_t rows, int p, int r) {
  nlohmann::json out{{"root", root}};
  Options o;
  o.collective_timeout_seconds = 120;
  auto mgr = testing::OpenAgreed(root, o);
  out["open"] = mgr.ok() ? "OK" : mgr.status().ToString();
  if (!mgr.ok()) return out;
  auto steps = (*mgr)->CommittedSteps();
  // Every rank must see the same list before the collective calls below.
  int64_t n = steps.ok() ? static_cast<int64_t>(steps->size()) : -1;
  int64_t n0 = n;
  MPI_Bcast(&n0, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  int differ = n != n0, any_differ = 0;
  MPI_Allreduce(&differ, &any_differ, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!steps.ok() || any_differ) {
    out["open"] = steps.ok() ? "ranks list different steps" : steps.status().ToString();
    return out;
  }
  out["committed"] = *steps;
  out["steps"] = nlohmann::json::object();
  for (int64_t step : *steps) {
    std::string restored = RestoreAndCompare(**mgr, step, rows, p, r);
    Status v = (*mgr)->Verify(step);
    out["steps"][std::to_string(step)] = {{"restore", restored},
                                          {"verify", v.ok() ? "OK" : v.ToString()}};
  }
  return out;
}

int Check(const Args& a, int p, int r) {
  std::ifstream list(a.path);
  if (!list) return fmt::print(stderr, "cannot read '{}'\n", a.path), 1;
  std::string root;
  while (std::getline(list, root)) {
    if (root.empty()) continue;
    nlohmann::json j = CheckRoot(root, a.rows, p, r);
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
               "usage: state_job save ROOT FIRST LAST [--rows R] [--max-to-keep K] "
               "[--collective]\n       state_job check LIST [--rows R]\n");
  }
  return 2;
}

}  // namespace
}  // namespace mhckpt

int main(int argc, char** argv) { return mhckpt::testing::RunJob(argc, argv, mhckpt::Main); }
