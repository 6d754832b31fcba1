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
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/local_nodes.h"
#include "coordinator/local_store.h"
#include "io/marker.h"

namespace mhckpt::internal {

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
/// lines.
nlohmann::json ElectRestorable(const Nodes& nodes, const std::vector<std::string>& reports,
                               int keep, const std::string& dir);

}  // namespace mhckpt::internal
