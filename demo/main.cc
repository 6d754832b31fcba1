// mhckpt-train-demo: a small real training job that checkpoints with mhckpt.
//
//   mpirun -np 4 build/bin/mhckpt-train-demo --dir /tmp/ckpt --steps 200
//   mpirun -np 3 build/bin/mhckpt-train-demo --dir /tmp/ckpt --steps 400 --resume
//   srun build/bin/mhckpt-train-demo --dir /ckpt --steps 100000 --preemption --grace 60
//
// With --preemption, SIGTERM or SIGUSR1 on any rank (Slurm: sbatch
// --signal=USR1@60, or scancel --signal=USR1) stops every rank at the same
// step, which is saved and committed before the demo exits 0, printing
// "preempted at step N: saved in X s"; --resume continues from it.
//
// Prints the loss, each save's timings, and for every committed save and
// every restore a line "fingerprint step=<S> <hex>" (demo/fingerprint.h) that
// is the same for the same state on any world size.
#include <mpi.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "demo/train_loop.h"
#include "programs/main_guard.h"

namespace {

int Main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE;
  // Why MULTIPLE: CheckpointManager commits on its own I/O thread, which makes
  // MPI calls while the training loop makes its own.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  mhckpt::demo::TrainFlags flags;
  CLI::App app{
      "A multi-layer perceptron trained on a synthetic regression task, with its weights and "
      "Adam state sharded by rows across MPI ranks and checkpointed asynchronously with mhckpt. "
      "Run it under mpirun; resume on any number of ranks."};
  app.add_option("--dir", flags.dir, "Checkpoint directory (created if missing)")->required();
  app.add_option("--steps", flags.steps, "Train until this global step")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--save-every", flags.save_every, "Save every N steps (0: only at the end)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--model-mib", flags.model_mib,
                 "Size of the sharded state (weights and Adam m, v) in MiB; picks the hidden "
                 "width")
      ->check(CLI::Range(0.01, 4096.0))
      ->capture_default_str();
  app.add_flag("--resume", flags.resume,
               "Restore the newest committed step that restores intact first (any world "
               "size; a damaged newer step is skipped) and continue");
  app.add_option("--max-to-keep", flags.max_to_keep,
                 "Keep only the newest N committed steps (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--local-dir", flags.local_dir,
                 "Node-local directory (a tmpfs or local disk) for the local tier: every save is "
                 "committed there first, with a copy on another node (Options::local_dir)");
  app.add_option("--persistent-every", flags.persistent_every,
                 "With --local-dir: every Nth save also goes to --dir (Options::persistent_every)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::string files = "one";
  app.add_option("--files", files,
                 "Data files per step: 'one' (data.h5), 'node' (a subfile per node) or N (a "
                 "subfile per N ranks), behind one data.h5 (Options::files)")
      ->check([](const std::string& v) {
        return v == "one" || v == "node" ||
                       (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos &&
                        v != "0")
                   ? std::string()
                   : std::string("want one, node or a positive number of ranks");
      })
      ->capture_default_str();
  app.add_flag("--lazy", flags.lazy,
               "Lazy saves (CopyMode::kLazy): Save returns before copying, and the next step "
               "waits for the copy");
  app.add_flag("--continuous", flags.continuous,
               "Also save whenever the previous save has finished on every rank "
               "(Options::save_continuously)");
  app.add_flag("--preemption", flags.preemption,
               "SIGTERM and SIGUSR1 are preemption notices (Options::preemption): every rank "
               "stops at the same step, saves it, waits for its commit and exits 0 (Slurm: "
               "sbatch --signal=USR1@60, or scancel --signal=USR1)");
  app.add_option("--grace", flags.grace_seconds,
                 "With --preemption: the scheduler's grace period in seconds, for the record in "
                 "the preemption step's commit marker (0: unknown)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--log-every", flags.log_every, "Print the mean loss every N steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", flags.seed, "Seed of the data, the teacher and the initial weights")
      ->capture_default_str();
  app.add_option("--batch", flags.global_batch, "Global batch size (split across ranks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", flags.learning_rate, "Adam learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = rank == 0 ? app.exit(e) : e.get_exit_code();
    MPI_Finalize();
    return rc;
  }
  flags.model_mib_given = app.count("--model-mib") > 0;
  flags.ranks_per_file = files == "one" ? 0 : files == "node" ? -1 : std::stoi(files);

  mhckpt::Status status = mhckpt::demo::RunTraining(flags, MPI_COMM_WORLD);
  // The lowest failing rank prints the error (it is the same everywhere).
  int mine = status.ok() ? size : rank, first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == rank) {
    fmt::print(stderr, "mhckpt-train-demo: error (rank {}): {}\n", rank, status.ToString());
  }
  MPI_Finalize();
  return first < size ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mhckpt::GuardedMain("mhckpt-train-demo", [&] { return Main(argc, argv); });
}
