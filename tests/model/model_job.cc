// The job of the model-based tester (tests/model/model_test.py): one mpirun
// that opens a two-tier manager and runs a list of operations on every rank,
// then reports what each one returned on each rank.
//
//   model_job SEGMENT.json
//
// SEGMENT.json: {"root": shared root, "local_base": dir of the simulated
// nodes' local dirs (node K: local_base/nodeK), "ranks_per_node": K,
// "options": {...}, "results": path, "pids": dir, "ops": [...]}. Rank R is on
// node R / ranks_per_node (Options::node_id). Each operation is an object with
// "op" and its arguments:
//   save     step, seed, tier (auto|local|persistent), copy (blocking|lazy),
//            arrays: [{name, dtype, shape, seed, save}] — `save` says how the
//            ranks hold it (rows, cols, rep, dp2, one, blocks). Every byte is
//            testing::Fill(dtype, shape, box, seed), so any rank of any later
//            job can predict every box.
//   wait     WaitUntilFinished (after every lazy save's fence)
//   steps    Steps() and LatestStep()
//   delete   step: Delete(step), then Steps() and LatestStep()
//   restore  step, source (any|local|persistent), seed, arrays: [{name,
//            dtype, shape, seed, restore}] — `restore` is the new sharding
//            (rows_rev, cols2, all, one, rand); every byte returned is compared
//   fault    spec: fault::Configure(spec) on every rank ("" clears)
//   gate     file: every rank waits (at most `timeout` s) until FILE.reached
//            exists (a save held at a fault point with action=wait)
//   release  file: rank 0 creates FILE (the held save goes on)
//   hold     file: like gate, then every rank sleeps until the driver kills
//            the job (a kill at an exact point of the protocol)
// After the last operation every gate file named in the list is created (no
// save stays held), lazy fences are waited for, WaitUntilFinished is called
// ("end") and the manager is destroyed.
//
// Rank 0 appends one JSON line per operation to `results` as soon as it
// ends: {"i": index, "op": kind, "ranks": [per-rank result]}, where a
// rank's result has "status" (its Status as text, "" for OK), "code", and per
// kind "steps" ([[step, persistent, local]...]), "latest", "bad" (restored
// boxes that differ), "fired" (fault::Fired()). A killed job leaves the lines
// of the operations that ended.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::Fill;

struct ArraySpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t seed = 0;
  std::string sharding;
};

ArraySpec ParseArray(const json& a, const char* sharding_key) {
  ArraySpec s;
  s.name = a.at("name").get<std::string>();
  s.dtype = DTypeFromName(a.at("dtype").get<std::string>()).value();
  s.shape = a.at("shape").get<std::vector<int64_t>>();
  s.seed = a.at("seed").get<uint64_t>();
  s.sharding = a.at(sharding_key).get<std::string>();
  return s;
}

// `shape` cut along dimension `dim` into `parts`, piece `part`.
Box Slab(const std::vector<int64_t>& shape, size_t dim, int parts, int part) {
  Box b = FullBox(shape);
  auto [lo, hi] = SplitRange(shape[dim], parts, part);
  b.start[dim] = lo;
  b.count[dim] = hi - lo;
  return b;
}

bool Empty(const Box& b) {
  for (int64_t c : b.count) {
    if (c == 0) return true;
  }
  return false;
}

std::vector<Box> NonEmpty(std::vector<Box> boxes) {
  std::vector<Box> out;
  for (Box& b : boxes) {
    if (!Empty(b)) out.push_back(std::move(b));
  }
  return out;
}

// The boxes rank r of p holds when saving.
std::vector<Box> SaveBoxes(const ArraySpec& s, int p, int r) {
  const std::vector<int64_t>& sh = s.shape;
  if (sh.empty() || s.sharding == "rep") return {FullBox(sh)};
  if (s.sharding == "rows") return NonEmpty({Slab(sh, 0, p, r)});
  if (s.sharding == "cols") return NonEmpty({Slab(sh, sh.size() - 1, p, r)});
  if (s.sharding == "dp2") {  // two row halves, each held by every other rank
    if (p == 1) return {FullBox(sh)};
    return NonEmpty({Slab(sh, 0, 2, r % 2)});
  }
  if (s.sharding == "one") {
    if (r == static_cast<int>(s.seed % static_cast<uint64_t>(p))) return {FullBox(sh)};
    return {};
  }
  if (s.sharding == "blocks" && sh.size() >= 2 && p == 4) {
    Box b = FullBox(sh);
    auto [x0, x1] = SplitRange(sh[0], 2, r / 2);
    auto [y0, y1] = SplitRange(sh[1], 2, r % 2);
    b.start[0] = x0, b.count[0] = x1 - x0, b.start[1] = y0, b.count[1] = y1 - y0;
    return NonEmpty({b});
  }
  return NonEmpty({Slab(sh, 0, p, r)});
}

// The boxes rank r of p asks for when restoring: never the save's layout.
std::vector<Box> RestoreBoxes(const ArraySpec& s, int p, int r, uint64_t op_seed) {
  const std::vector<int64_t>& sh = s.shape;
  if (sh.empty() || s.sharding == "all") return {FullBox(sh)};
  if (s.sharding == "rows_rev") {  // p + 1 row parts, reversed; rank 0 takes two
    std::vector<Box> out;
    for (int part = 0; part <= p; ++part) {
      if (part % p == r) out.push_back(Slab(sh, 0, p + 1, p - part));
    }
    return NonEmpty(out);
  }
  if (s.sharding == "cols2") {
    const size_t d = sh.size() - 1;
    return NonEmpty({Slab(sh, d, 2 * p, r), Slab(sh, d, 2 * p, 2 * p - 1 - r)});
  }
  if (s.sharding == "one") {
    if (r == static_cast<int>(op_seed % static_cast<uint64_t>(p))) return {FullBox(sh)};
    return {};
  }
  // "rand": one random sub-box per rank (may overlap other ranks' boxes).
  std::mt19937_64 g(op_seed * 7919 + static_cast<uint64_t>(r) * 131 + s.seed);
  Box b = FullBox(sh);
  for (size_t d = 0; d < sh.size(); ++d) {
    if (sh[d] == 0) continue;
    const int64_t lo = static_cast<int64_t>(g() % static_cast<uint64_t>(sh[d]));
    const int64_t n = 1 + static_cast<int64_t>(g() % static_cast<uint64_t>(sh[d] - lo));
    b.start[d] = lo;
    b.count[d] = n;
  }
  return NonEmpty({b});
}

SaveTier TierOf(const std::string& t) {
  return t == "local"        ? SaveTier::kLocal
         : t == "persistent" ? SaveTier::kPersistent
                             : SaveTier::kAuto;
}

RestoreSource SourceOf(const std::string& s) {
  return s == "local"        ? RestoreSource::kLocal
         : s == "persistent" ? RestoreSource::kPersistent
                             : RestoreSource::kAny;
}

json StatusJson(const Status& s) {
  return {{"status", s.ok() ? "" : s.ToString()}, {"code", StatusCodeName(s.code())}};
}

// Buffers of a save that mhckpt may still read (a lazy save before its fence).
struct Held {
  std::vector<std::vector<std::byte>> bufs;
  SaveFence fence;
};

class Job {
 public:
  Job(json seg, int p, int r) : seg_(std::move(seg)), p_(p), r_(r) {}

  int Run() {
    WritePid();
    if (r_ == 0) out_ = std::fopen(seg_.at("results").get<std::string>().c_str(), "a");
    Options o = MakeOptions();
    auto opened = testing::OpenAgreed(seg_.at("root").get<std::string>(), o);
    json mine = StatusJson(opened.ok() ? OkStatus() : opened.status());
    if (opened.ok()) {
      mgr_ = std::move(opened).value();
      AddSteps(&mine);
    }
    Report(-1, "open", mine);
    if (!mgr_) return 1;
    const json& ops = seg_.at("ops");
    for (size_t i = 0; i < ops.size(); ++i) {
      const json& op = ops[i];
      const std::string kind = op.at("op").get<std::string>();
      json res = Do(kind, op);
      Report(static_cast<int>(i), kind, res);
    }
    // No save may stay held at a gate: the manager's destructor waits for it.
    for (const json& op : ops) {
      if (op.contains("file") && r_ == 0) std::ofstream(op.at("file").get<std::string>()) << "go";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    json end = Wait();
    Report(static_cast<int>(ops.size()), "end", end);
    mgr_.reset();
    fault::Configure("").IgnoreError();
    if (out_) std::fclose(out_);
    return 0;
  }

 private:
  Options MakeOptions() const {
    const json& oj = seg_.at("options");
    Options o;
    const int rpn = seg_.at("ranks_per_node").get<int>();
    const int node = r_ / rpn;
    o.node_id = node;
    o.local_dir = fmt::format("{}/node{}", seg_.at("local_base").get<std::string>(), node);
    o.persistent_every = oj.value("persistent_every", 1);
    o.local_max_to_keep = oj.value("local_max_to_keep", 2);
    o.local_copies = oj.value("local_copies", 1);
    o.local_parity_group = oj.value("local_parity_group", 0);
    o.max_to_keep = oj.value("max_to_keep", 0);
    o.persistent_deadline_seconds = oj.value("persistent_deadline_seconds", 0.0);
    o.collective_timeout_seconds = oj.value("collective_timeout_seconds", 300.0);
    o.root_wait_seconds = 10;
    return o;
  }

  void WritePid() const {
    const fs::path dir = seg_.at("pids").get<std::string>();
    fs::create_directories(dir);
    const std::string tmp = (dir / fmt::format(".rank{}.tmp", r_)).string();
    std::ofstream(tmp) << getpid() << "\n";
    fs::rename(tmp, dir / fmt::format("rank{}", r_));
  }

  // Rank 0 writes one line with every rank's result of operation i.
  void Report(int i, const std::string& kind, const json& mine) {
    const std::string text = mine.dump();
    int n = static_cast<int>(text.size());
    std::vector<int> sizes(static_cast<size_t>(p_));
    MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::vector<int> displs(static_cast<size_t>(p_), 0);
    int total = 0;
    for (int k = 0; k < p_; ++k)
      displs[static_cast<size_t>(k)] = total, total += sizes[static_cast<size_t>(k)];
    std::string all(static_cast<size_t>(r_ == 0 ? total : 0), '\0');
    MPI_Gatherv(text.data(), n, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, 0,
                MPI_COMM_WORLD);
    if (r_ != 0) return;
    json ranks = json::array();
    for (int k = 0; k < p_; ++k) {
      ranks.push_back(json::parse(all.substr(static_cast<size_t>(displs[static_cast<size_t>(k)]),
                                             static_cast<size_t>(sizes[static_cast<size_t>(k)]))));
    }
    json line{{"i", i}, {"op", kind}, {"ranks", ranks}};
    if (out_) {
      std::fprintf(out_, "%s\n", line.dump().c_str());
      std::fflush(out_);
    }
  }

  void AddSteps(json* res) const {
    auto steps = mgr_->Steps();
    json list = json::array();
    if (steps.ok()) {
      for (const auto& t : *steps) list.push_back({t.step, t.persistent, t.local});
    } else {
      (*res)["steps_error"] = steps.status().ToString();
    }
    (*res)["steps"] = list;
    auto latest = mgr_->LatestStep();
    (*res)["latest"] = latest.ok() && latest->has_value() ? json(**latest) : json(nullptr);
  }

  json Do(const std::string& kind, const json& op) {
    if (kind == "save") return Save(op);
    if (kind == "wait") return Wait();
    if (kind == "steps") {
      json res = StatusJson(OkStatus());
      AddSteps(&res);
      return res;
    }
    if (kind == "delete") {
      json res = StatusJson(mgr_->Delete(op.at("step").get<int64_t>()));
      AddSteps(&res);
      return res;
    }
    if (kind == "restore") return Restore(op);
    if (kind == "check") return Check(op);
    if (kind == "latest") return Latest(op);
    if (kind == "fault") {
      fired_before_ += fault::Fired();
      Status s = fault::Configure(op.at("spec").get<std::string>());
      return StatusJson(s);
    }
    if (kind == "gate" || kind == "hold") {
      const std::string reached = op.at("file").get<std::string>() + ".reached";
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(op.value("timeout", 30.0));
      bool ok = true;
      while (!fs::exists(reached)) {
        if (std::chrono::steady_clock::now() > until) {
          ok = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (kind == "hold" && ok) {
        if (r_ == 0 && out_) {
          std::fprintf(out_, "%s\n", json{{"held", op.at("file")}}.dump().c_str());
          std::fflush(out_);
        }
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the driver kills
      }
      return StatusJson(ok ? OkStatus() : FailedPrecondition("gate not reached: " + reached));
    }
    if (kind == "release") {
      if (r_ == 0) std::ofstream(op.at("file").get<std::string>()) << "go";
      MPI_Barrier(MPI_COMM_WORLD);
      return StatusJson(OkStatus());
    }
    return StatusJson(InvalidArgument("unknown op " + kind));
  }

  json Save(const json& op) {
    const int64_t step = op.at("step").get<int64_t>();
    const bool lazy = op.value("copy", "blocking") == "lazy";
    auto held = std::make_unique<Held>();
    std::vector<ArrayToSave> arrays;
    for (const json& aj : op.at("arrays")) {
      ArraySpec s = ParseArray(aj, "save");
      ArrayToSave a{s.name, s.dtype, s.shape, {}};
      for (const Box& b : SaveBoxes(s, p_, r_)) {
        held->bufs.push_back(Fill(s.dtype, s.shape, b, s.seed));
        a.shards.push_back(Shard{b, held->bufs.back().data()});
      }
      arrays.push_back(std::move(a));
    }
    SaveOptions so;
    so.tier = TierOf(op.value("tier", "auto"));
    so.copy = lazy ? CopyMode::kLazy : CopyMode::kBlocking;
    Status s = mgr_->Save(step, arrays, {{"model_step", std::to_string(step)}}, so,
                          lazy ? &held->fence : nullptr);
    if (!lazy) {
      Scribble(*held);  // Save has copied every box: the buffers are the caller's again
    } else {
      lazy_.push_back(std::move(held));
    }
    json res = StatusJson(s);
    res["fired"] = fired_before_ + fault::Fired();
    return res;
  }

  static void Scribble(Held& h) {
    for (auto& b : h.bufs) std::memset(b.data(), 0xA5, b.size());
  }

  json Wait() {
    json fences = json::array();
    for (auto& h : lazy_) {
      Status f = h->fence.Wait();
      fences.push_back(f.ok() ? "" : f.ToString());
      Scribble(*h);
    }
    lazy_.clear();
    Status s = mgr_->WaitUntilFinished();
    json res = StatusJson(s);
    res["fences"] = fences;
    res["fired"] = fired_before_ + fault::Fired();
    AddSteps(&res);
    return res;
  }

  json Restore(const json& op) {
    const int64_t step = op.at("step").get<int64_t>();
    const uint64_t seed = op.value("seed", uint64_t{0});
    std::vector<ArraySpec> specs;
    std::vector<std::vector<Box>> boxes;
    std::vector<std::vector<std::byte>> bufs;
    std::vector<ArrayToRestore> want;
    for (const json& aj : op.at("arrays")) specs.push_back(ParseArray(aj, "restore"));
    for (const ArraySpec& s : specs) {
      boxes.push_back(RestoreBoxes(s, p_, r_, seed));
      ArrayToRestore a{s.name, s.dtype, {}};
      for (const Box& b : boxes.back()) {
        bufs.emplace_back(BoxBytes(b, s.dtype), std::byte{0x5A});
        a.shards.push_back(Destination{b, bufs.back().data()});
      }
      want.push_back(std::move(a));
    }
    RestoreOptions ro;
    ro.source = SourceOf(op.value("source", "any"));
    Status s = mgr_->Restore(step, want, ro);
    int64_t bad = 0, checked = 0;
    std::string first_bad;
    if (s.ok()) {
      size_t k = 0;
      for (size_t i = 0; i < specs.size(); ++i) {
        for (const Box& b : boxes[i]) {
          if (Fill(specs[i].dtype, specs[i].shape, b, specs[i].seed) != bufs[k]) {
            if (bad++ == 0) first_bad = fmt::format("{} box {}", specs[i].name, BoxToString(b));
          }
          checked += static_cast<int64_t>(bufs[k].size());
          ++k;
        }
      }
    }
    json res = StatusJson(s);
    res["bad"] = bad;
    res["checked_bytes"] = checked;
    if (!first_bad.empty()) res["first_bad"] = first_bad;
    return res;
  }

  // RestoreLatest into `arrays` (no seeds: those of the step it picks, as
  // the generator gives them: step * 64 + index + 1), every byte compared.
  json Latest(const json& op) {
    std::vector<ArraySpec> specs;
    std::vector<std::vector<Box>> boxes;
    std::vector<std::vector<std::byte>> bufs;
    std::vector<ArrayToRestore> want;
    for (const json& aj : op.at("arrays")) {
      json a = aj;
      a["seed"] = 0;
      specs.push_back(ParseArray(a, "restore"));
    }
    for (const ArraySpec& s : specs) {
      boxes.push_back(RestoreBoxes(s, p_, r_, 0));
      ArrayToRestore a{s.name, s.dtype, {}};
      for (const Box& b : boxes.back()) {
        bufs.emplace_back(BoxBytes(b, s.dtype), std::byte{0x5A});
        a.shards.push_back(Destination{b, bufs.back().data()});
      }
      want.push_back(std::move(a));
    }
    RestoreOptions ro;
    ro.source = SourceOf(op.value("source", "any"));
    Result<int64_t> got = mgr_->RestoreLatest(want, ro);
    json res = StatusJson(got.ok() ? OkStatus() : got.status());
    int64_t bad = 0;
    if (got.ok()) {
      res["step"] = *got;
      size_t k = 0;
      for (size_t i = 0; i < specs.size(); ++i) {
        const uint64_t seed = static_cast<uint64_t>(*got) * 64 + i + 1;
        for (const Box& b : boxes[i]) {
          if (Fill(specs[i].dtype, specs[i].shape, b, seed) != bufs[k++]) ++bad;
        }
      }
    }
    res["bad"] = bad;
    return res;
  }

  // Every step that Steps() lists (rank 0's list, so that every rank runs the
  // same restores) and `catalog` knows, restored from the tier the manager
  // picks and, where the shared root holds it too, from the shared root.
  json Check(const json& op) {
    std::vector<int64_t> listed;
    if (r_ == 0) {
      auto steps = mgr_->Steps();
      if (steps.ok()) {
        for (const auto& t : *steps) listed.insert(listed.end(), {t.step, t.persistent ? 1 : 0});
      }
    }
    int64_t n = static_cast<int64_t>(listed.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    listed.resize(static_cast<size_t>(n));
    MPI_Bcast(listed.data(), static_cast<int>(n), MPI_INT64_T, 0, MPI_COMM_WORLD);
    const json& catalog = op.at("catalog");
    json res = StatusJson(OkStatus());
    json checked = json::object();
    for (size_t i = 0; i + 1 < listed.size(); i += 2) {
      const std::string key = std::to_string(listed[i]);
      if (!catalog.contains(key)) continue;
      json one = json::object();
      for (const char* source : {"any", "persistent"}) {
        if (std::string(source) == "persistent" && listed[i + 1] == 0) continue;
        json r = Restore({{"step", listed[i]},
                          {"source", source},
                          {"seed", op.value("seed", uint64_t{0}) + static_cast<uint64_t>(i)},
                          {"arrays", catalog.at(key)}});
        one[source] = {{"code", r.at("code")}, {"bad", r.at("bad")}, {"status", r.at("status")}};
      }
      checked[key] = one;
    }
    res["checked"] = checked;
    return res;
  }

  json seg_;
  const int p_, r_;
  std::FILE* out_ = nullptr;
  std::unique_ptr<CheckpointManager> mgr_;
  std::vector<std::unique_ptr<Held>> lazy_;
  int64_t fired_before_ = 0;
};

}  // namespace
}  // namespace mhckpt

int main(int argc, char** argv) {
  return mhckpt::testing::RunJob(argc, argv, [](int argc, char** argv, int p, int r) {
    if (argc != 2) {
      if (r == 0) std::fprintf(stderr, "usage: model_job SEGMENT.json\n");
      return 2;
    }
    std::ifstream in(argv[1]);
    auto seg = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (seg.is_discarded()) {
      if (r == 0) std::fprintf(stderr, "model_job: %s is not JSON\n", argv[1]);
      return 2;
    }
    mhckpt::fault::SetRank(r);
    return mhckpt::Job(std::move(seg), p, r).Run();
  });
}
