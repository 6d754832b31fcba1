// mhckpt: inspect, verify and clean up checkpoint directories.
//
//   mhckpt list ROOT [--local-dir DIR] [--json]
//   mhckpt inspect ROOT [--step N] [--json]
//   [mpirun -np K] mhckpt verify ROOT [--step N | --all]
//   mhckpt gc ROOT --keep N [--force] [--dry-run]
//
// Exit status: 0 on success, 1 on an error or damage (the message on stderr),
// CLI11's codes for bad usage. Only verify is collective (MPI is initialised
// for it alone); the other commands run as one process.
#include <mpi.h>

#include <optional>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/gc_command.h"
#include "cli/inspect_command.h"
#include "cli/list_command.h"
#include "cli/verify_command.h"
#include "programs/main_guard.h"

namespace {

// Runs verify between MPI_Init and MPI_Finalize; every rank returns alike.
mhckpt::Status RunVerifyUnderMpi(const mhckpt::cli::VerifyArgs& args, int* rank) {
  MPI_Init(nullptr, nullptr);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  mhckpt::Status s = mhckpt::cli::RunVerify(args, MPI_COMM_WORLD, stdout);
  MPI_Finalize();
  return s;
}

int Main(int argc, char** argv) {
  CLI::App app{"mhckpt: inspect, verify and clean up mhckpt checkpoint directories."};
  app.require_subcommand(1);

  mhckpt::cli::ListArgs list;
  CLI::App* list_cmd = app.add_subcommand(
      "list",
      "List every step under ROOT, committed or not: size on disk, world size at save, "
      "creation time.");
  list_cmd->add_option("root", list.root, "Checkpoint root directory")->required();
  list_cmd->add_option("--local-dir", list.local_dir,
                       "Also list this node's local tier (the Options::local_dir of the job)");
  list_cmd->add_flag("--json", list.json, "Print JSON instead of a table");

  mhckpt::cli::InspectArgs inspect;
  std::optional<int64_t> inspect_step;
  CLI::App* inspect_cmd = app.add_subcommand(
      "inspect",
      "Show one committed step: arrays (name, dtype, shape, boxes and the rank that "
      "wrote each) and user metadata.");
  inspect_cmd->add_option("root", inspect.root, "Checkpoint root directory")->required();
  inspect_cmd->add_option("--step", inspect_step, "Step to show (default: newest committed)");
  inspect_cmd->add_flag("--json", inspect.json, "Print JSON");

  mhckpt::cli::VerifyArgs verify;
  std::optional<int64_t> verify_step;
  CLI::App* verify_cmd = app.add_subcommand(
      "verify",
      "Re-read committed steps through HDF5 and check them against their commit markers: the "
      "marker is valid, its boxes tile every array, each dataset exists with the marker's type "
      "and shape, and every box reads back with the XXH3 checksum the marker records. Without "
      "--step, also reports any step whose marker exists but is invalid. May run under "
      "mpirun -np K to split the reads. Exit status 1 on damage, naming the array and box.");
  verify_cmd->add_option("root", verify.root, "Checkpoint root directory")->required();
  CLI::Option* step_opt =
      verify_cmd->add_option("--step", verify_step, "Step to verify (default: newest committed)");
  verify_cmd->add_flag("--all", verify.all, "Verify every committed step")->excludes(step_opt);

  mhckpt::cli::GcArgs gc;
  CLI::App* gc_cmd = app.add_subcommand(
      "gc",
      "Delete all but the newest N committed steps, and uncommitted step directories "
      "(marker first, so no crash leaves a half-deleted committed step). Uncommitted steps "
      "newer than the newest committed one may be saves in progress: kept unless --force. "
      "gc takes ROOT's lock as a job does: while a job holds ROOT it deletes nothing and "
      "fails (exit status 1, naming the job), and a job that opens ROOT while gc runs finds "
      "it in use (or waits for it, with Options::root_wait_seconds). --dry-run takes no lock.");
  gc_cmd->add_option("root", gc.root, "Checkpoint root directory")->required();
  gc_cmd->add_option("--keep", gc.keep, "Committed steps to keep (at least 1)")
      ->required()
      ->check(CLI::Range(1, 1 << 30));
  gc_cmd->add_flag("--force", gc.force, "Also delete uncommitted steps newer than the newest");
  gc_cmd->add_flag("--dry-run", gc.dry_run, "Only print what would be deleted");

  CLI11_PARSE(app, argc, argv);

  mhckpt::Status status;
  int rank = 0;
  if (*list_cmd) {
    status = mhckpt::cli::RunList(list, stdout);
  } else if (*inspect_cmd) {
    inspect.step = inspect_step;
    status = mhckpt::cli::RunInspect(inspect, stdout);
  } else if (*verify_cmd) {
    verify.step = verify_step;
    status = RunVerifyUnderMpi(verify, &rank);
  } else if (*gc_cmd) {
    status = mhckpt::cli::RunGc(gc, stdout);
  }
  if (!status.ok()) {
    if (rank == 0) fmt::print(stderr, "mhckpt: {}\n", status.ToString());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mhckpt::GuardedMain("mhckpt", [&] { return Main(argc, argv); });
}
