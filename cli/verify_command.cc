// Verify, as run by every rank:
//
//   1. Rank 0 lists the root and picks the steps (and reports invalid
//      markers); the outcome and the steps are broadcast.
//   2. Every rank opens the root as a CheckpointManager that changes
//      nothing (no removal of uncommitted steps, no retention).
//   3. Per step, CheckpointManager::Verify, collective, with rank 0 showing
//      progress; rank 0 prints the step's report.
//   4. Rank 0 decides the outcome from every problem and broadcasts it, so
//      every rank exits alike.
#include "cli/verify_command.h"

#include <chrono>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "base/comm.h"
#include "cli/progress.h"
#include "cli/step_info.h"
#include "cli/text_format.h"
#include "coordinator/agree.h"
#include "coordinator/checkpoint_manager.h"
#include "io/root_store.h"

namespace mhckpt::cli {

using internal::BroadcastStatus;
using internal::Comm;
namespace {

// Rank 0: the steps to verify, and problems found in the listing.
Status ChooseSteps(const VerifyArgs& args, std::vector<int64_t>* steps,
                   std::vector<std::string>* problems) {
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<io::RootStore> store, OpenRoot(args.root));
  if (args.step) {
    steps->push_back(*args.step);
    return OkStatus();
  }
  MHCKPT_ASSIGN_OR_RETURN(std::vector<io::StepEntry> entries, store->ListSteps());
  std::optional<int64_t> latest;
  for (const io::StepEntry& e : entries) {
    if (e.committed) {
      latest = e.step;
      if (args.all) steps->push_back(e.step);
    } else if (!e.marker.ok()) {
      // A marker that exists but does not parse: never written that way by
      // the atomic commit, so it is damage, not a crashed save.
      problems->push_back(fmt::format("step {}: {}", e.step, e.marker.ToString()));
    }
  }
  if (!args.all && latest) steps->push_back(*latest);
  if (steps->empty() && problems->empty()) {
    return NotFound(fmt::format("no committed step in '{}'", args.root));
  }
  return OkStatus();
}

// Collective: step 3 for one step. Rank 0 prints its report; returns its
// problems.
std::vector<std::string> VerifyOne(CheckpointManager& mgr, int64_t step, const Comm& comm,
                                   Progress& progress, std::FILE* out) {
  const std::string label = fmt::format("verify step {} (rank 0 of {})", step, comm.size());
  VerifyOptions options;
  options.progress = [&](uint64_t done, uint64_t share) { progress.Update(label, done, share); };
  VerifyReport r;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = mgr.Verify(step, options, &r);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.Clear();
  // A step that is not committed, or whose marker cannot be read, has no
  // problem list of its own: the Status is the problem.
  if (!s.ok() && r.problems.empty())
    r.problems.push_back(fmt::format("step {}: {}", step, s.ToString()));
  if (comm.rank() == 0) {
    const int size = comm.size();
    fmt::print(out, "step {}: {} arrays, {} boxes, {} read by {} rank{} in {:.2f} s: {}\n", step,
               r.arrays, r.boxes, HumanBytes(r.bytes_checked), size, size == 1 ? "" : "s", seconds,
               r.problems.empty() ? "OK"
                                  : fmt::format("DAMAGED ({} problem{})", r.problems.size(),
                                                r.problems.size() == 1 ? "" : "s"));
    for (const std::string& p : r.problems) fmt::print(out, "  {}\n", p);
  }
  return r.problems;
}

}  // namespace

Status RunVerify(const VerifyArgs& args, MPI_Comm comm, std::FILE* out) {
  Comm world = Comm::Duplicate(comm);
  const bool root_rank = world.rank() == 0;

  // 1. Steps, chosen by rank 0.
  std::vector<int64_t> steps;
  std::vector<std::string> problems;
  MHCKPT_RETURN_IF_ERROR(
      BroadcastStatus(root_rank ? ChooseSteps(args, &steps, &problems) : OkStatus(), 0, world));
  world.BroadcastValues(&steps, 0);
  if (root_rank) {
    for (const std::string& p : problems) fmt::print(out, "invalid commit marker: {}\n", p);
  }

  // 2. The root, opened read-only in effect.
  Options options;
  options.async = false;
  options.own_root = false;  // a job may be saving into the root: take nothing, remove nothing
  options.collective_timeout_seconds = 0;  // a verify of a huge step may take long
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointManager> mgr,
                          CheckpointManager::Open(comm, args.root, options));

  // 3. Each step.
  Progress progress(root_rank);
  for (int64_t step : steps) {
    std::vector<std::string> found = VerifyOne(*mgr, step, world, progress, out);
    problems.insert(problems.end(), found.begin(), found.end());
  }

  // 4. The outcome, from rank 0, which alone saw the listing's problems.
  Status outcome;
  if (root_rank) {
    if (!problems.empty()) {
      outcome = DataLoss(fmt::format("{} problem{} in '{}'; first: {}", problems.size(),
                                     problems.size() == 1 ? "" : "s", args.root, problems.front()));
    } else {
      fmt::print(out, "verified {} step{} in {}: OK (structure, readability and checksums)\n",
                 steps.size(), steps.size() == 1 ? "" : "s", args.root);
    }
    std::fflush(out);
  }
  return BroadcastStatus(outcome, 0, world);
}

}  // namespace mhckpt::cli
