#include "coordinator/root_upkeep.h"

#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "base/log.h"
#include "coordinator/agree.h"

namespace mhckpt::internal {

Status RemoveLeftovers(io::RootStore& store, bool log) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> garbage, store.StepsWithoutMarker());
  for (int64_t step : garbage) {
    if (log) Logger()->info("mhckpt: removing uncommitted step {} in {}", step, store.root());
    MHCKPT_RETURN_IF_ERROR(store.RemoveStep(step));
  }
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> retired, store.RetiredSteps());
  for (const std::string& dir : retired) {
    if (log) Logger()->info("mhckpt: removing {}, retired by a previous job", dir);
    MHCKPT_RETURN_IF_ERROR(store.RemoveRetired(dir));
  }
  return OkStatus();
}

Status ShareText(const Comm& comm, int root, const Status& status, std::string* text) {
  MHCKPT_RETURN_IF_ERROR(BroadcastStatus(status, root, comm));
  comm.BroadcastBytes(text, root);
  return OkStatus();
}

Result<io::Marker> ShareMarker(const Comm& comm, int root, std::string* text,
                               const std::string& origin, io::MarkerText kind) {
  comm.BroadcastBytes(text, root);
  Result<io::Marker> m = io::ParseMarker(*text, origin, kind);
  if (!m.ok()) {
    return Status(m.status().code(), fmt::format("rank {}: {}", comm.rank(), m.status().message()));
  }
  return m;
}

}  // namespace mhckpt::internal
