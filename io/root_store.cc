#include "io/root_store.h"

#include "io/posix_root_store.h"

namespace mhckpt::io {

Result<std::vector<int64_t>> RootStore::CommittedSteps() {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepEntry> all, ListSteps());
  std::vector<int64_t> steps;
  for (const StepEntry& e : all) {
    if (e.committed) steps.push_back(e.step);
  }
  return steps;
}

Result<Marker> RootStore::ReadMarker(int64_t step) {
  MHCKPT_ASSIGN_OR_RETURN(std::string text, GetMarker(step));
  return ParseMarker(text, MarkerLocation(step));
}

Status RootStore::DeleteStep(int64_t step) {
  MHCKPT_ASSIGN_OR_RETURN(std::string retired, RetireStep(step));
  if (retired.empty()) return OkStatus();
  return RemoveRetired(retired);
}

std::unique_ptr<RootStore> MakeRootStore(const std::string& root) {
  return std::make_unique<PosixRootStore>(root);
}

}  // namespace mhckpt::io
