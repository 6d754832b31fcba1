#include "cli/gc_command.h"

#include <memory>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "cli/step_info.h"
#include "cli/text_format.h"
#include "coordinator/retention.h"
#include "io/root_store.h"

namespace mhckpt::cli {

using internal::StepsToDelete;

Status RunGc(const GcArgs& args, std::FILE* out) {
  if (args.keep < 1) return InvalidArgument(fmt::format("--keep {}: keep at least 1", args.keep));
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<io::RootStore> store, OpenRoot(args.root));
  // Deleting takes the root as a job's Open does, without waiting, so that
  // gc never races a job's own retention or save: while a job holds the root
  // gc fails and deletes nothing; while gc holds it a job's Open finds it in
  // use. The lock comes first and the listing after, so that what gc deletes
  // is what it saw with the root held. A dry run reads only.
  std::unique_ptr<io::RootOwnership> lock;
  if (!args.dry_run) {
    Result<std::unique_ptr<io::RootOwnership>> taken = store->Acquire({});
    if (!taken.ok()) {
      return Status(taken.status().code(),
                    fmt::format("gc deleted nothing: {}", taken.status().message()));
    }
    lock = std::move(*taken);
  }
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, ReadSteps(*store));
  std::vector<int64_t> committed;
  for (const StepInfo& s : steps) {
    if (s.entry.committed) committed.push_back(s.entry.step);
  }
  const bool any_committed = !committed.empty();
  const int64_t newest = any_committed ? committed.back() : 0;
  const std::vector<int64_t> old = StepsToDelete(committed, args.keep, /*keep_period=*/0);
  const std::set<int64_t> drop(old.begin(), old.end());

  const char* verb = args.dry_run ? "would delete" : "deleted";
  size_t deleted = 0, kept_committed = 0;
  uint64_t freed = 0;
  for (const StepInfo& s : steps) {
    std::string why;
    if (s.entry.committed) {
      if (!drop.count(s.entry.step)) {
        ++kept_committed;
        continue;
      }
      why = "committed, older than the newest " + std::to_string(args.keep);
    } else {
      const std::string state = StepState(s.entry);
      if (!args.force && (!any_committed || s.entry.step > newest)) {
        fmt::print(out,
                   "kept step {}: {} and newer than the newest committed step (a save in "
                   "progress?); --force deletes it\n",
                   s.entry.step, state);
        continue;
      }
      why = state;
    }
    if (!args.dry_run) {
      Status st = store->DeleteStep(s.entry.step);
      if (!st.ok()) {
        return Status(st.code(), fmt::format("deleting step {}: {}", s.entry.step, st.message()));
      }
    }
    fmt::print(out, "{} step {} ({}, {})\n", verb, s.entry.step, why, HumanBytes(s.bytes_on_disk));
    ++deleted;
    freed += s.bytes_on_disk;
  }
  // Steps a job retired (marker gone, directory renamed) but did not finish
  // removing: it ended or crashed first.
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> retired, store->RetiredSteps());
  for (const std::string& dir : retired) {
    if (!args.dry_run) {
      Status st = store->RemoveRetired(dir);
      if (!st.ok()) return Status(st.code(), fmt::format("deleting {}: {}", dir, st.message()));
    }
    fmt::print(out, "{} {} (retired, its removal unfinished)\n", verb, dir);
  }
  fmt::print(out, "gc {}: {} {} step{} ({}); {} committed step{} kept\n", args.root, verb, deleted,
             deleted == 1 ? "" : "s", HumanBytes(freed), kept_committed,
             kept_committed == 1 ? "" : "s");
  return OkStatus();
}

}  // namespace mhckpt::cli
