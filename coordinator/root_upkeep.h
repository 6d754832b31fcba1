// Upkeep that a shared root and the local tier's node dirs have in common:
// removing what a crash left in a root, and giving every rank the text that
// one rank built or read (a marker, a plan, a view) — the "one rank builds
// the text, broadcasts it, every rank parses it, then all agree" pattern.
// Both tiers use it: the shared root at Open (coordinator/checkpoint_manager.cc)
// and in its marker and listing broadcasts (committed_step.cc,
// restore_latest.cc), the local tier in coordinator/local_store.cc and
// local_tier.cc.
#pragma once

#include <string>

#include "base/comm.h"
#include "base/status.h"
#include "io/marker.h"
#include "io/root_store.h"

namespace mhckpt::internal {

/// Removes what a crash left in `store`: the steps without a marker, then
/// the retired step directories whose removal did not finish. With `log`,
/// says so per item (info).
Status RemoveLeftovers(io::RootStore& store, bool log);

/// Collective: `status` is rank `root`'s outcome of building `*text` there;
/// on every rank, that outcome (BroadcastStatus), and if OK, `root`'s text
/// in `*text`.
Status ShareText(const Comm& comm, int root, const Status& status, std::string* text);

/// Collective: rank `root`'s marker text (`*text` there) on every rank, in
/// `*text`, and parsed (`origin` names it in errors). A rank that cannot
/// parse it gets its own error, naming the rank: not agreed, so that the
/// caller's next agreement (AgreeAll) reports it on every rank.
Result<io::Marker> ShareMarker(const Comm& comm, int root, std::string* text,
                               const std::string& origin,
                               io::MarkerText kind = io::MarkerText::kCommit);

}  // namespace mhckpt::internal
