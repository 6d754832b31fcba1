#include "cli/gc_command.h"

#include <optional>

#include <fmt/format.h>

#include "cli/step_info.h"
#include "cli/text_format.h"
#include "io/catalog.h"

namespace mhckpt::cli {

Status RunGc(const GcArgs& args, std::FILE* out) {
  if (args.keep < 1) return InvalidArgument(fmt::format("--keep {}: keep at least 1", args.keep));
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, ReadSteps(args.root));
  std::vector<const StepInfo*> committed;
  for (const StepInfo& s : steps) {
    if (s.entry.committed) committed.push_back(&s);
  }
  const std::optional<int64_t> newest =
      committed.empty() ? std::nullopt : std::optional<int64_t>(committed.back()->entry.step);
  const size_t drop = committed.size() > static_cast<size_t>(args.keep)
                          ? committed.size() - static_cast<size_t>(args.keep)
                          : 0;

  const char* verb = args.dry_run ? "would delete" : "deleted";
  size_t deleted = 0, kept_committed = 0;
  uint64_t freed = 0;
  for (const StepInfo& s : steps) {
    std::string why;
    if (s.entry.committed) {
      // keep >= 1, so committed[drop] is the oldest step kept.
      if (s.entry.step >= committed[drop]->entry.step) {
        ++kept_committed;
        continue;
      }
      why = "committed, older than the newest " + std::to_string(args.keep);
    } else {
      const std::string state = StepState(s.entry);
      if (!args.force && (!newest || s.entry.step > *newest)) {
        fmt::print(out,
                   "kept step {}: {} and newer than the newest committed step (a save in "
                   "progress?); --force deletes it\n",
                   s.entry.step, state);
        continue;
      }
      why = state;
    }
    if (!args.dry_run) {
      Status st = io::DeleteStep(args.root, s.entry.step);
      if (!st.ok()) {
        return Status(st.code(), fmt::format("deleting step {}: {}", s.entry.step, st.message()));
      }
    }
    fmt::print(out, "{} step {} ({}, {})\n", verb, s.entry.step, why, HumanBytes(s.bytes_on_disk));
    ++deleted;
    freed += s.bytes_on_disk;
  }
  fmt::print(out, "gc {}: {} {} step{} ({}); {} committed step{} kept\n", args.root, verb, deleted,
             deleted == 1 ? "" : "s", HumanBytes(freed), kept_committed,
             kept_committed == 1 ? "" : "s");
  return OkStatus();
}

}  // namespace mhckpt::cli
