// mhckpt-step-bench: a training-like loop saving at every step, against the
// same loop without checkpoints (bench/run_every_step.sh).
//
//   mpirun -np 1 build/bin/mhckpt-step-bench --mib 256 --rate 1
//       --root /var/tmp/r --local /dev/shm/l --json out.json
//
// Each rank holds --mib MiB of state in 16 float32 arrays (touched memory).
// One step: a compute kernel on the caller's core (arithmetic on a buffer
// that stays in cache) for the time that makes the step, kernel and update
// together, last `state bytes / rate` seconds without checkpoints (the kernel
// trimmed by timing that loop before the reps); then, in a
// lazy mode, the wait on the previous save's fence; then the update of every
// state array (each element written); then one small allreduce (a training
// step's gradient exchange, which keeps the ranks in step); then the save.
// Modes, interleaved rep by rep on one manager (Options::local_dir on
// --local, Options::persistent_every = --every):
//   none      no save;
//   lazy      Save(CopyMode::kLazy) at every step, the fence waited for
//             before the next update;
//   blocking  Save at every step;
//   continuous  a lazy Save at the steps CheckpointManager::ShouldSave picks
//             (Options::save_continuously: when the previous save has
//             finished on every rank), asked at every step.
// A rep runs --steps steps of each mode, after --warmup steps of it; its
// figure is the slowest rank's steps/s. Reported per mode: the median steps/s
// over --reps reps, the slowdown against none, and where a step's time goes
// (medians over every step of every rep, per rank then the slowest):
// Save's call, the fence wait, and the SaveTimings of the saves (budget_wait,
// snapshot (the copy), plan, local), and the CPU seconds of the process per
// step (work mhckpt adds on the free core).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
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

using json = nlohmann::json;

struct Flags {
  double mib = 256;  // per rank
  double rate = 1;   // GB/s of state per second of training
  int steps = 20;
  int warmup = 3;
  int reps = 3;
  int every = 100;
  std::string modes = "none,lazy,blocking";
  std::string root = "/var/tmp/mhckpt-step-bench";
  std::string local = "/dev/shm/mhckpt-step-bench";
  std::string json;
};

constexpr int kArrays = 16;

class State {
 public:
  explicit State(double mib) {
    n_ = static_cast<size_t>(mib * 1048576.0 / (kArrays * 4.0));
    for (int i = 0; i < kArrays; ++i) {
      data_.emplace_back(n_);
      for (size_t k = 0; k < n_; ++k) data_.back()[k] = float(k % 977) + float(i);
    }
  }
  [[nodiscard]] std::vector<ArrayToSave> Arrays() const {
    std::vector<ArrayToSave> out;
    const auto n = static_cast<int64_t>(n_);
    for (int i = 0; i < kArrays; ++i) {
      out.push_back({fmt::format("s{:02}", i),
                     DType::kFloat32,
                     {n * Size()},
                     {Shard{Box{{n * Rank()}, {n}}, data_[static_cast<size_t>(i)].data()}}});
    }
    return out;
  }
  // The update: every element of every array written.
  void Update() {
    for (auto& a : data_) {
      for (float& x : a) x = x * 0.5F + 1.0F;
    }
  }
  [[nodiscard]] size_t bytes() const { return size_t{kArrays} * n_ * 4; }

 private:
  size_t n_ = 0;
  std::vector<std::vector<float>> data_;
};

// A training step's compute: arithmetic on a buffer that stays in cache.
void Compute(int64_t iters) {
  static std::vector<float> v(16384, 1.0F);
  for (int64_t it = 0; it < iters; ++it) {
    for (float& x : v) x = x * 0.999F + 0.001F;
  }
  volatile float sink = v[static_cast<size_t>(iters) % v.size()];
  (void)sink;
}

double TimeCompute(int64_t iters) {
  auto t0 = Clock::now();
  Compute(iters);
  return Since(t0);
}

// Iterations of Compute per second on this core: the fastest of 5 trials
// (on a busy machine a slower one is other work's, not the kernel's).
double ComputeRate() {
  int64_t iters = 16;
  while (TimeCompute(iters) < 0.05) iters *= 2;
  double best = 0;
  for (int i = 0; i < 5; ++i) best = std::max(best, double(iters) / TimeCompute(iters));
  return best;
}

struct StepFigures {
  std::vector<double> save_call, fence_wait, budget_wait, snapshot, plan, local, cpu;
  int steps = 0, saves = 0;
};

class Bench {
 public:
  explicit Bench(const Flags& f) : f_(f), state_(f.mib) {}

  json Run() {
    // The step: kernel + update last bytes / rate without checkpoints.
    const double step_s = double(state_.bytes()) / (f_.rate * 1e9);
    // The fastest of 3 updates, as ComputeRate.
    double upd = 1e30;
    for (int i = 0; i < 3; ++i) {
      auto t0 = Clock::now();
      state_.Update();
      upd = std::min(upd, Since(t0));
    }
    const double update_s = MaxOverRanks(upd);
    const double rate = ComputeRate();
    const double kernel_s = std::max(0.0, step_s - update_s);
    iters_ = static_cast<int64_t>(kernel_s * rate);

    Options o;
    o.local_dir = f_.local;
    o.persistent_every = f_.every;
    o.max_to_keep = 1;
    o.save_continuously = true;  // ShouldSave's policy (mode continuous only asks it)
    auto opened = CheckpointManager::Open(MPI_COMM_WORLD, f_.root, o);
    Check(opened.status(), "open");
    mgr_ = std::move(opened).value();

    std::vector<std::string> modes;
    for (size_t at = 0; at <= f_.modes.size();) {
      size_t end = f_.modes.find(',', at);
      if (end == std::string::npos) end = f_.modes.size();
      if (end > at) modes.push_back(f_.modes.substr(at, end - at));
      at = end + 1;
    }
    // Timed apart, the kernel and the update need not add up to the loop's
    // step (at 1 GiB the update alone has timed 0.10 s in one build and
    // 0.18 s in another, while in the loop it took about the latter in
    // both). So the loop without saves is timed, and the kernel trimmed
    // until its step is within 3 % of step_s (at most 4 rounds).
    double none_step_s = 0;
    for (int round = 0; round < 4; ++round) {
      none_step_s = 1.0 / Loop("none", std::max(3, f_.warmup), nullptr);
      if (std::abs(none_step_s - step_s) <= 0.03 * step_s) break;
      const double rest = none_step_s - double(iters_) / rate;  // all but the kernel
      iters_ = static_cast<int64_t>(std::max(0.0, step_s - rest) * rate);
    }
    std::map<std::string, std::vector<double>> steps_per_s;
    std::map<std::string, StepFigures> figures;
    for (int rep = 0; rep < f_.reps; ++rep) {
      for (const std::string& m : modes) {
        Loop(m, f_.warmup, nullptr);
        steps_per_s[m].push_back(Loop(m, f_.steps, &figures[m]));
      }
    }
    Check(mgr_->WaitUntilFinished(), "wait");
    mgr_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (Rank() == 0) {
      std::filesystem::remove_all(f_.root);
      std::filesystem::remove_all(f_.local);
    }

    json r;
    r["mib"] = f_.mib;
    r["rate_gbps"] = f_.rate;
    r["state_bytes"] = state_.bytes();
    r["step_s"] = step_s;
    r["update_s"] = update_s;
    r["kernel_s"] = kernel_s;  // before the loop's trim
    r["kernel_trimmed_s"] = MaxOverRanks(double(iters_) / rate);
    r["none_step_trimmed_s"] = none_step_s;  // the loop without saves, last trim round
    r["steps"] = f_.steps;
    r["reps"] = f_.reps;
    r["every"] = f_.every;
    const double base = steps_per_s.count("none") ? Median(steps_per_s["none"]) : 0;
    for (const std::string& m : modes) {
      json c;
      c["steps_per_s"] = Median(steps_per_s[m]);
      c["steps_per_s_reps"] = steps_per_s[m];
      if (base > 0) c["slowdown_pct"] = (1.0 - Median(steps_per_s[m]) / base) * 100.0;
      const StepFigures& s = figures[m];
      auto med = [](const std::vector<double>& v) { return MaxOverRanks(Median(v)); };
      c["save_call_s"] = med(s.save_call);
      c["fence_wait_s"] = med(s.fence_wait);
      c["budget_wait_s"] = med(s.budget_wait);
      c["snapshot_s"] = med(s.snapshot);
      c["plan_s"] = med(s.plan);
      c["local_s"] = med(s.local);
      c["cpu_per_step_s"] = med(s.cpu);
      if (s.steps > 0) c["saves_per_step"] = double(s.saves) / double(s.steps);
      r["modes"][m] = c;
    }
    return r;
  }

 private:
  // `n` steps of mode `m`; the slowest rank's steps/s.
  double Loop(const std::string& m, int n, StepFigures* fig) {
    const bool continuous = m == "continuous";
    const bool lazy = m == "lazy" || continuous, save = m != "none";
    SaveOptions so;
    if (lazy) so.copy = CopyMode::kLazy;
    const std::vector<ArrayToSave> arrays = state_.Arrays();
    SaveFence fence;
    bool pending = false;
    Check(mgr_->WaitUntilFinished(), "wait");
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      const double cpu0 = ProcessCpuSeconds();
      Compute(iters_);
      auto tf = Clock::now();
      if (pending) Check(fence.Wait(), "fence");
      const double fence_wait = Since(tf);
      pending = false;
      state_.Update();
      double one = 1, sum = 0;
      MPI_Allreduce(&one, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      double call = 0;
      bool now = save;
      if (continuous) {
        Result<bool> should = mgr_->ShouldSave(step_);
        Check(should.status(), "should save");
        now = should.value();
      }
      if (now) {
        auto ts = Clock::now();
        Check(mgr_->Save(step_, arrays, {}, so, lazy ? &fence : nullptr), "save");
        call = Since(ts);
        pending = lazy;
      }
      if (fig != nullptr) {
        ++fig->steps;
        fig->saves += now ? 1 : 0;
      }
      if (fig != nullptr && now) {
        const SaveTimings t = mgr_->LastSaveTimings();
        fig->save_call.push_back(call);
        fig->fence_wait.push_back(fence_wait);
        fig->budget_wait.push_back(t.budget_wait);
        fig->snapshot.push_back(t.snapshot);
        fig->plan.push_back(t.plan);
        fig->local.push_back(t.local);
      }
      if (fig != nullptr) fig->cpu.push_back(ProcessCpuSeconds() - cpu0);
      ++step_;
    }
    if (pending) Check(fence.Wait(), "fence");
    const double elapsed = MaxOverRanks(Since(t0));
    return double(n) / elapsed;
  }

  Flags f_;
  State state_;
  int64_t iters_ = 0;
  int64_t step_ = 1;
  std::unique_ptr<CheckpointManager> mgr_;
};

}  // namespace
}  // namespace mhckpt::bench

int main(int argc, char** argv) {
  mhckpt::bench::Flags f;
  CLI::App app{"mhckpt-step-bench: a training loop saving at every step"};
  app.add_option("--mib", f.mib, "MiB of state per rank");
  app.add_option("--rate", f.rate, "GB of state per second of training (step = bytes / rate)");
  app.add_option("--steps", f.steps, "steps per rep and mode");
  app.add_option("--warmup", f.warmup, "steps before each rep and mode, not timed");
  app.add_option("--reps", f.reps, "reps (medians), modes interleaved");
  app.add_option("--every", f.every, "Options::persistent_every");
  app.add_option("--modes", f.modes, "comma-separated: none, lazy, blocking, continuous");
  app.add_option("--root", f.root, "the shared root (removed at the end)");
  app.add_option("--local", f.local, "the local tier's dir (removed at the end)");
  app.add_option("--json", f.json, "write the figures here (rank 0)");
  return mhckpt::bench::BenchMain(
      argc, argv, app, &f.json, [&] { return mhckpt::bench::Bench(f).Run(); }, -1);
}
