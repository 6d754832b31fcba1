#include "io/catalog.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/posix_file.h"

namespace mhckpt::io {

Result<std::vector<StepEntry>> ListSteps(const std::string& root) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<StepEntry> steps;
  for (const std::string& name : names) {
    auto step = ParseStepDirName(name);
    if (!step) continue;
    StepEntry e{*step, false, OkStatus()};
    Result<Marker> m = ReadMarker(MarkerPath(root, *step));
    if (m.ok() && m->step == *step) {
      e.committed = true;
    } else if (m.ok()) {
      e.marker = DataLoss(fmt::format("marker of step {} says step {}", *step, m->step));
    } else if (m.status().code() != StatusCode::kNotFound) {
      e.marker = m.status();
    }
    steps.push_back(std::move(e));
  }
  std::sort(steps.begin(), steps.end(),
            [](const StepEntry& a, const StepEntry& b) { return a.step < b.step; });
  return steps;
}

Result<std::vector<int64_t>> CommittedSteps(const std::string& root) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepEntry> all, ListSteps(root));
  std::vector<int64_t> steps;
  for (const StepEntry& e : all) {
    if (e.committed) steps.push_back(e.step);
  }
  return steps;
}

Status DeleteStep(const std::string& root, int64_t step) {
  const std::string marker = MarkerPath(root, step);
  if (::unlink(marker.c_str()) != 0 && errno != ENOENT) {
    return IoError(fmt::format("unlink '{}': {}", marker, std::strerror(errno)));
  }
  if (PathExists(StepDir(root, step))) MHCKPT_RETURN_IF_ERROR(FsyncDir(StepDir(root, step)));
  MHCKPT_RETURN_IF_ERROR(fault::Hit("retention"));  // uncommitted now, files still there
  MHCKPT_RETURN_IF_ERROR(RemoveAll(StepDir(root, step)));
  return FsyncDir(root);
}

}  // namespace mhckpt::io
