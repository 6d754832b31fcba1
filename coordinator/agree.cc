#include "coordinator/agree.h"

#include <fmt/format.h>

namespace mhckpt::internal {

Status AgreeAll(const Status& local, const Comm& comm) {
  // Why an allreduce: it is the one step that no rank can leave before every
  // rank has entered it; MAX of (size - rank) finds the lowest failing rank.
  int lowest = comm.AllreduceMax(local.ok() ? 0 : comm.size() - comm.rank());
  if (lowest == 0) return OkStatus();
  int root = comm.size() - lowest;
  int failed = comm.AllreduceSum(local.ok() ? 0 : 1);
  return WithFailedCount(BroadcastStatus(local, root, comm), failed);
}

Status WithFailedCount(const Status& first, int failed) {
  if (first.ok() || failed <= 1) return first;
  return {first.code(), fmt::format("{} (and {} more rank{} failed)", first.message(), failed - 1,
                                    failed > 2 ? "s" : "")};
}

Status BroadcastStatus(const Status& status, int root, const Comm& comm) {
  std::string bytes = comm.rank() == root ? status.Serialize() : std::string();
  comm.BroadcastBytes(&bytes, root);
  return Status::Deserialize(bytes);
}

}  // namespace mhckpt::internal
