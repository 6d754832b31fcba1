#include "cli/step_info.h"

#include <fmt/format.h>

#include "io/layout.h"
#include "io/step_index.h"

namespace mhckpt::cli {

Result<std::unique_ptr<io::RootStore>> OpenRoot(const std::string& root) {
  std::unique_ptr<io::RootStore> store = io::MakeRootStore(root);
  if (!store->Exists()) return NotFound(fmt::format("no checkpoint root '{}'", root));
  return store;
}

Result<std::vector<StepInfo>> ReadSteps(io::RootStore& store) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<io::StepEntry> entries, store.ListSteps());
  std::vector<StepInfo> steps;
  for (io::StepEntry& e : entries) {
    StepInfo info{std::move(e), std::nullopt, 0};
    info.bytes_on_disk = store.StepBytes(info.entry.step);
    if (info.entry.committed) {
      Result<io::Marker> m = store.ReadMarker(info.entry.step);
      if (m.ok()) {
        info.marker = std::move(m).value();
      } else {  // it changed since the listing
        info.entry.committed = false;
        info.entry.marker = m.status();
      }
    }
    steps.push_back(std::move(info));
  }
  return steps;
}

Result<io::Marker> ReadCommittedStep(io::RootStore& store, std::optional<int64_t> step) {
  const std::string& root = store.root();
  if (!step) {
    MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> committed, store.CommittedSteps());
    if (committed.empty()) return NotFound(fmt::format("no committed step in '{}'", root));
    step = committed.back();
  }
  Result<io::Marker> m = store.ReadMarker(*step);
  if (!m.ok() && m.status().code() == StatusCode::kNotFound) {
    return NotFound(
        fmt::format("step {} is not committed in '{}' (no commit marker)", *step, root));
  }
  if (m.ok() && m->step != *step) {
    return DataLoss(
        fmt::format("commit marker of step {} in '{}' says step {}", *step, root, m->step));
  }
  // Format 3: the checksums, from the whole index, checked.
  if (m.ok() && m->format_version >= 3) {
    MHCKPT_RETURN_IF_ERROR(io::LoadIndex(io::IndexPath(root, *step), &*m));
  }
  return m;
}

std::string StepState(const io::StepEntry& entry) {
  if (entry.committed) return "committed";
  return entry.marker.ok() ? "uncommitted" : "invalid_marker";
}

}  // namespace mhckpt::cli
