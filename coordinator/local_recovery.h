// Recovery of the local tier (coordinator/local_tier.h, Open): what
// survives on the nodes of this job, agreed across ranks.
//
// Each node's lowest rank reports, per committed step of its dir, what it
// holds whole (NodeHoldings); rank 0 elects from every node's report the
// steps this job can restore (ElectRestorable) and LocalTier::Open
// broadcasts that view. A step is restorable when every writer's file
// survives on some node of this job, or can be rebuilt from its parity
// group, at any world size.
//
// Nodes may hold two saves of one step number (a job that could not restore
// a local step saved it again while a node outside that job kept the older
// save): the newest save (its marker's creation time, so the clocks of the
// jobs' rank-0 hosts must agree) is the step; two made at the same time
// count for neither.
//
// A node outside the job when CheckpointManager::Delete deleted a step
// keeps its local files of it. So that the step does not come back when the
// node rejoins, Delete records the step and the time of the deletion in the
// shared root first: the election skips every save of the step made until
// then (by its marker's creation time: the clocks caveat above), and the
// nodes that hold one remove it. A later save of the same step number is
// restored as any other.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "coordinator/local_nodes.h"
#include "coordinator/local_store.h"
#include "io/marker.h"

namespace mhckpt::internal {

/// The steps Delete deleted: step -> when (unix ms). Every save of the step
/// created until then is deleted.
using Deletions = std::map<int64_t, int64_t>;

/// The most steps the record keeps (the highest): a node away while more
/// steps than that were deleted may bring an older one back.
inline constexpr size_t kMaxDeletedSteps = 4096;

/// The record in the shared root (io/root_store.h, GetLocalDeletions):
/// {"deleted": [[step, unix_ms], ...]}. DataLoss naming `origin` if it does
/// not parse.
Result<Deletions> ParseLocalDeletions(const std::string& text, const std::string& origin);
/// The record of `deleted`, its highest kMaxDeletedSteps steps only.
std::string LocalDeletionsToJson(const Deletions& deleted);

/// A node's report of one committed local step: its marker's hash `hash`,
/// the world size and creation time of its save, the writer files and
/// parity blocks the node holds whole (the expected size), and the parity
/// groups of the save (parity.json).
nlohmann::json NodeHoldings(const LocalPaths& paths, int64_t step, const io::Marker& m,
                            int64_t hash);

/// Rank 0: from every rank's report (`reports[r]`: a JSON array of
/// NodeHoldings, "[]" from ranks that lead no node), the steps this job can
/// restore, the newest `keep`, ascending. Each entry: "step", "source" (a
/// rank whose node holds its marker), "holders" (per writer, the ranks
/// whose node holds its file), "parity_holders" (per rank, the ranks whose
/// node holds its block), "groups" (of the save) and "rebuild" (pairs [lost
/// writer, rank that rebuilds its file]). `dir` names the local dir in log
/// lines. A save of a step in `deleted` made until its deletion is not
/// restorable.
nlohmann::json ElectRestorable(const Nodes& nodes, const std::vector<std::string>& reports,
                               int keep, const std::string& dir, const Deletions& deleted = {});

}  // namespace mhckpt::internal
