#include "demo/train_loop.h"

#include <chrono>
#include <memory>
#include <optional>

#include "coordinator/checkpoint_manager.h"
#include "demo/console.h"
#include "demo/fingerprint.h"
#include "demo/trainer.h"

namespace mhckpt::demo {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Bytes of the global arrays (every element once).
uint64_t GlobalBytes(const std::vector<ArrayToSave>& arrays) {
  uint64_t total = 0;
  for (const ArrayToSave& a : arrays) {
    total += static_cast<uint64_t>(Volume(a.shape).value_or(0)) * DTypeSize(a.dtype);
  }
  return total;
}

// Collective: rank 0's view of the newest committed step, so that every rank
// takes the same branch even if the directory changes meanwhile.
Result<std::optional<int64_t>> AgreedLatestStep(const CheckpointManager& mgr, MPI_Comm comm) {
  Result<std::optional<int64_t>> latest = mgr.LatestStep();
  // [ok, has step, step]
  int64_t v[3] = {latest.ok() ? 1 : 0, latest.ok() && latest->has_value() ? 1 : 0,
                  latest.ok() && latest->has_value() ? **latest : 0};
  MPI_Bcast(v, 3, MPI_INT64_T, 0, comm);
  if (!v[0]) {
    return latest.ok() ? IoError("rank 0 could not list the checkpoint directory")
                       : latest.status();
  }
  return v[1] ? std::optional<int64_t>(v[2]) : std::nullopt;
}

// Collective: reads the model config of the newest step whose config
// restores intact, then restores every array into a new trainer, each rank
// asking for its own rows under the current world size, from the newest step
// that restores intact as a whole (CheckpointManager::RestoreLatest: a
// damaged newest step falls back to an older one, with a log line); `*step`
// gets that step.
Result<std::unique_ptr<Trainer>> RestoreTrainer(CheckpointManager& mgr, const TrainFlags& flags,
                                                MPI_Comm comm, const Console& out, int64_t* step) {
  std::array<int64_t, ModelConfig::kEncodedSize> encoded{};
  ArrayToRestore config_request{
      kConfigArrayName,
      DType::kInt64,
      {Destination{FullBox({ModelConfig::kEncodedSize}), encoded.data()}}};
  MHCKPT_RETURN_IF_ERROR(mgr.RestoreLatest(std::span(&config_request, 1)).status());
  MHCKPT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Decode(encoded));
  if (flags.model_mib_given) {
    out.Line("note: --model-mib is ignored on --resume: the checkpoint's model is {}",
             config.Describe());
  }
  auto trainer = std::make_unique<Trainer>(config, flags.learning_rate, comm);
  std::vector<ArrayToRestore> requests = trainer->ArraysToRestore();
  // Every step of a run holds the same arrays: the config read above is
  // the one of whichever step restores (FinishRestore checks it).
  MHCKPT_ASSIGN_OR_RETURN(*step, mgr.RestoreLatest(requests, RestoreOptions{.strict = true}));
  MHCKPT_RETURN_IF_ERROR(trainer->FinishRestore());
  if (trainer->step() != *step) {
    return DataLoss(fmt::format("array 'train/step' of step {} holds {}", *step, trainer->step()));
  }
  return trainer;
}

// With the local tier: where a restore of committed step `step` reads, " (local
// tier)" if that tier holds it, else " (shared root)". Rank 0's answer is
// the one printed (the tiers' view is the same on every rank).
std::string TierOf(const CheckpointManager& mgr, int64_t step) {
  auto steps = mgr.Steps();
  bool local = false;
  if (steps.ok()) {
    for (const CheckpointManager::StepTiers& t : *steps) {
      if (t.step == step) local = t.local;
    }
  }
  return local ? " (local tier)" : " (shared root)";
}

// A save handed to the I/O thread, not yet known to be committed.
struct PendingSave {
  int64_t step = 0;
  uint64_t fingerprint = 0;
  double blocked = 0;  // seconds Save kept the training loop waiting
};

// Collective: waits for `pending` to commit and prints its timings and
// fingerprint.
Status ConfirmSave(CheckpointManager& mgr, const PendingSave& pending, uint64_t bytes,
                   bool local_tier, const Console& out) {
  auto t0 = Clock::now();
  MHCKPT_RETURN_IF_ERROR(mgr.WaitUntilFinished());
  const double waited = Since(t0);
  const SaveTimings t = mgr.LastSaveTimings();  // rank 0's clocks
  const double background = t.plan + t.local + t.write + t.flush + t.commit + t.gc;
  out.Line(
      "committed step={}: {:.1f} MiB; Save() blocked training {:.3f} s (snapshot {:.3f}); "
      "background {:.3f} s = plan {:.3f} + {}write {:.3f} + flush {:.3f} + commit {:.3f} + gc "
      "{:.3f} ({:.0f} MiB/s); waited {:.3f} s for it{}",
      pending.step, MiB(bytes), pending.blocked, t.snapshot, background, t.plan,
      local_tier ? fmt::format("local tier {:.3f} + ", t.local) : "", t.write, t.flush, t.commit,
      t.gc, background > 0 ? MiB(bytes) / background : 0.0, waited,
      !local_tier    ? ""
      : t.persistent ? "; in both tiers"
                     : "; in the local tier only");
  out.Line("fingerprint step={} {}", pending.step, FingerprintHex(pending.fingerprint));
  return OkStatus();
}

}  // namespace

Status RunTraining(const TrainFlags& flags, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const Console out(rank);
  const auto start = Clock::now();

  Options options;
  options.max_to_keep = flags.max_to_keep;
  options.local_dir = flags.local_dir;
  options.persistent_every = flags.persistent_every;
  options.files.ranks_per_file = flags.ranks_per_file;
  // The save policy is the manager's (ShouldSave): every save_every steps,
  // continuously if asked, and at the preemption step.
  options.save_interval_steps = flags.save_every;
  options.save_continuously = flags.continuous;
  options.preemption.enabled = flags.preemption;
  options.preemption.grace_seconds = flags.grace_seconds;
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointManager> mgr,
                          CheckpointManager::Open(comm, flags.dir, options));
  if (!mgr->async()) out.Line("note: MPI lacks MPI_THREAD_MULTIPLE; saves are synchronous");
  MHCKPT_ASSIGN_OR_RETURN(std::optional<int64_t> latest, AgreedLatestStep(*mgr, comm));

  std::unique_ptr<Trainer> trainer;
  int64_t skip_saves_through = -1;
  if (flags.resume) {
    if (!latest) {
      return NotFound(fmt::format("--resume: no committed step in '{}'", flags.dir));
    }
    auto t0 = Clock::now();
    int64_t restored = -1;
    MHCKPT_ASSIGN_OR_RETURN(trainer, RestoreTrainer(*mgr, flags, comm, out, &restored));
    const double restore_s = Since(t0);
    if (restored != *latest) {
      out.Line(
          "note: step {}, the newest committed, does not restore intact; resuming from step {}",
          *latest, restored);
      skip_saves_through = *latest;
    }
    std::vector<ArrayToSave> arrays = trainer->ArraysToSave();
    const uint64_t fp = GlobalFingerprint(arrays, comm);
    out.Line("restored step={} from {}{} at {} rank{}: {:.1f} MiB in {:.3f} s", restored, flags.dir,
             flags.local_dir.empty() ? "" : TierOf(*mgr, restored), size, size == 1 ? "" : "s",
             MiB(GlobalBytes(arrays)), restore_s);
    out.Line("fingerprint step={} {}", restored, FingerprintHex(fp));
  } else {
    if (latest) {
      return FailedPrecondition(
          fmt::format("'{}' already holds committed step {}: pass --resume to continue from it, "
                      "or use a fresh directory",
                      flags.dir, *latest));
    }
    ModelConfig config = ModelConfig::ForStateSize(flags.model_mib, flags.seed, flags.global_batch);
    MHCKPT_RETURN_IF_ERROR(config.Validate());
    trainer = std::make_unique<Trainer>(config, flags.learning_rate, comm);
    out.Line("fresh start in {}", flags.dir);
  }
  const std::vector<ArrayToSave> layout = trainer->ArraysToSave();
  const uint64_t state_bytes = GlobalBytes(layout);
  const ModelConfig& config = trainer->config();
  out.Line(
      "model: MLP {} ({:.2f} M parameters), {} arrays, {:.1f} MiB of state; {} rank{}, "
      "global batch {}",
      config.Describe(), static_cast<double>(trainer->mlp().num_params()) / 1e6, layout.size(),
      MiB(state_bytes), size, size == 1 ? "" : "s", config.global_batch);
  const UserMetadata metadata = {{"demo", "mhckpt-train-demo"},
                                 {"model", "MLP " + config.Describe()},
                                 {"seed", std::to_string(config.seed)}};

  const bool local_tier = !flags.local_dir.empty();
  std::optional<PendingSave> pending;
  SaveFence fence;  // the last lazy save's copy (an empty fence is complete)
  double loss_sum = 0;
  int64_t loss_count = 0;
  while (trainer->step() < flags.steps) {
    // A lazy save still reads the arrays until its fence completes. Its
    // error, if any, fails the save on every rank through WaitUntilFinished.
    (void)fence.Wait();
    loss_sum += trainer->Step();  // overwrites every array handed to the last Save
    ++loss_count;
    const int64_t step = trainer->step();
    if (step % flags.log_every == 0 || step == flags.steps) {
      out.Line("step {} loss {:.6f}", step, loss_sum / static_cast<double>(loss_count));
      loss_sum = 0;
      loss_count = 0;
    }
    // Collective, every step, on every rank: a non-blocking round that turns
    // a notice on any rank into the same step everywhere, a step or two later.
    MHCKPT_ASSIGN_OR_RETURN(const bool policy, mgr->ShouldSave(step));
    bool preempted = false;
    if (flags.preemption) {
      MHCKPT_ASSIGN_OR_RETURN(preempted, mgr->ReachedPreemption(step));
    }
    const auto preempted_at = Clock::now();
    const bool save = policy || step == flags.steps;
    // After a resume that fell back past damaged steps, those steps stay
    // committed: saving one again would fail (AlreadyExists), so the saves
    // up to the newest committed step are skipped.
    if (step <= skip_saves_through && save) {
      out.Line("note: step {} is not saved: a committed (damaged) step {} is newer", step,
               skip_saves_through);
    } else if (save) {
      // At most one save in flight: the previous one must have committed.
      if (pending)
        MHCKPT_RETURN_IF_ERROR(ConfirmSave(*mgr, *pending, state_bytes, local_tier, out));
      std::vector<ArrayToSave> arrays = trainer->ArraysToSave();
      PendingSave p{step, GlobalFingerprint(arrays, comm), 0};
      auto t0 = Clock::now();
      SaveOptions save_options;
      if (flags.lazy) save_options.copy = CopyMode::kLazy;
      Status saved = mgr->Save(step, arrays, metadata, save_options, &fence);
      p.blocked = Since(t0);
      // Why agree: a local input error on one rank fails the save everywhere,
      // and no rank may go on training (collectives) while another stops.
      int local_ok = saved.ok() ? 1 : 0, all_ok = 0;
      MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
      if (!all_ok) {
        // WaitUntilFinished returns the same error on every rank.
        Status agreed = mgr->WaitUntilFinished();
        return agreed.ok() ? saved : agreed;
      }
      // The state's fingerprint as it was saved, before it is known to
      // commit: a step that commits in the local tier but not in the shared
      // root (the job died in between) never gets its "committed" line.
      out.Line("saving step={} fingerprint {}", step, FingerprintHex(p.fingerprint));
      pending = p;
    }
    if (preempted) {
      // The step every rank agreed on: its save (ShouldSave said so) must
      // commit before the scheduler's grace period ends.
      if (pending)
        MHCKPT_RETURN_IF_ERROR(ConfirmSave(*mgr, *pending, state_bytes, local_tier, out));
      if (pending && pending->step == step) {
        out.Line("preempted at step {}: saved in {:.3f} s", step, Since(preempted_at));
      } else {
        out.Line("preempted at step {}: not saved (committed step {} is newer)", step,
                 skip_saves_through);
      }
      return OkStatus();
    }
  }
  if (pending) MHCKPT_RETURN_IF_ERROR(ConfirmSave(*mgr, *pending, state_bytes, local_tier, out));
  out.Line("done: step {} in {:.1f} s", trainer->step(), Since(start));
  return OkStatus();
}

}  // namespace mhckpt::demo
