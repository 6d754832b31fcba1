// Restore of the newest step that restores intact (decision 12 of the design:
// a damaged copy is a reason to use another, not to stop), run by every rank
// on its I/O thread after the pending saves:
//
//   1. The candidates, agreed: rank 0 lists the shared root (the committed
//      steps, and the steps whose marker exists but does not parse) and
//      broadcasts the list; the local tier's view is agreed already. They
//      are tried newest first, and for a step both tiers hold, the local
//      tier first (RestoreOptions::source narrows them to one tier).
//   2. Per candidate: its marker (the local view's, or rank 0's read of the
//      shared root's, broadcast), the requests checked against it (one
//      agreement), then the restore itself (coordinator/local_restore.cc,
//      which tries every copy and the parity of a damaged piece first;
//      coordinator/restore.cc), every byte checked.
//   3. A candidate that cannot be served whole — DataLoss or NotFound of its
//      marker or of a piece — is skipped, with one log line on rank 0 naming
//      the step, the tier and why; the outcome is agreed (every attempt ends
//      in one), so every rank skips alike. Any other error (a request that
//      does not match the step, an IoError, Internal) is returned as it is:
//      it is not about the step's bytes, and an older step would not cure it.
//   4. The step restored, or NotFound naming every candidate skipped.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/committed_step.h"
#include "coordinator/manager_impl.h"
#include "coordinator/root_upkeep.h"
#include "worker/copy.h"

namespace mhckpt {
namespace internal {
namespace {

// One step to try: its number, the tier, and (shared root) why its marker
// is damaged, if it is.
struct Candidate {
  int64_t step = 0;
  bool local = false;
  std::string damaged;  // empty: the marker parses
};

// Step 3: an error that says the candidate cannot be served whole.
bool SkipsTheStep(const Status& s) {
  return s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kNotFound;
}

// Step 1, rank 0: the shared root's candidates as JSON [[step, damaged], ...].
Result<std::string> ListSharedRoot(io::RootStore& store) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<io::StepEntry> entries, store.ListSteps());
  nlohmann::json out = nlohmann::json::array();
  for (const io::StepEntry& e : entries) {
    if (e.committed) {
      out.push_back({e.step, ""});
    } else if (!e.marker.ok()) {
      // A marker that exists but does not parse: damage, not a crashed save.
      out.push_back({e.step, e.marker.message()});
    }
  }
  return out.dump();
}

}  // namespace

Result<int64_t> ManagerImpl::RestoreLatest(std::span<const ArrayToRestore> given,
                                           const RestoreOptions& options) {
  // Here, on the caller's thread: cudaStreamPerThread names its stream only
  // here, not on the I/O thread that copies (worker/copy.h).
  StreamProxies callers;
  std::vector<ArrayToRestore> resolved;
  const std::span<const ArrayToRestore> arrays = callers.Resolve(given, &resolved);
  Result<int64_t> restored = NotFound("no step restored");
  Status done = RunOnIoThread([&]() -> Status {
    const int rank = comm_.rank();
    // 1.
    std::string shared = "[]";
    Status listed;
    if (rank == 0 && options.source != RestoreSource::kLocal) {
      listed = Guarded("rank 0: listing the shared root", [&]() -> Status {
        MHCKPT_ASSIGN_OR_RETURN(shared, ListSharedRoot(*store_));
        return OkStatus();
      });
      if (!listed.ok()) {
        listed = Status(listed.code(), fmt::format("rank 0: listing the steps of '{}': {}", root_,
                                                   listed.message()));
      }
    }
    // Why: only rank 0 listed; every rank must try the same candidates.
    MHCKPT_RETURN_IF_ERROR(ShareText(comm_, 0, listed, &shared));
    std::vector<Candidate> candidates;
    for (const nlohmann::json& e : nlohmann::json::parse(shared)) {
      candidates.push_back({e.at(0).get<int64_t>(), false, e.at(1).get<std::string>()});
    }
    if (local_ && options.source != RestoreSource::kPersistent) {
      for (int64_t step : local_->Steps()) candidates.push_back({step, true, ""});
    }
    // Newest first; the local tier before the shared root.
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      return a.step != b.step ? a.step > b.step : a.local > b.local;
    });

    // 2.
    std::vector<std::string> skipped;
    for (const Candidate& c : candidates) {
      const char* tier = c.local ? "local tier" : "shared root";
      RestoreOptions o = options;
      o.verify_checksums = true;  // an unchecked restore cannot tell intact from damaged
      o.source = c.local ? RestoreSource::kLocal : RestoreSource::kPersistent;
      Status s;
      {
        Watchdog::Guard phase(watchdog_, "restore", c.step);
        Result<io::Marker> marker = DataLoss(c.damaged);
        if (c.local) {
          std::shared_ptr<const LocalStep> ls = local_->Find(c.step);
          marker = ls ? Result<io::Marker>(ls->marker)
                      : Result<io::Marker>(NotFound("no longer in the local tier"));
        } else if (c.damaged.empty()) {
          marker = ReadMarkerEverywhere(comm_, *store_, c.step);
        }
        // Requests that do not match the step are the caller's error, not
        // the step's: returned, never skipped over.
        if (marker.ok()) {
          MHCKPT_RETURN_IF_ERROR(
              AgreeAll(Guarded(fmt::format("rank {}: restore of step {}", rank, c.step),
                               [&] { return CheckRequests(*marker, arrays, o, rank); }),
                       comm_));
          s = RunRestore(c.step, arrays, o);
        } else {
          s = marker.status();
        }
      }
      if (s.ok()) {
        if (rank == 0 && !skipped.empty()) {
          Logger()->warn("mhckpt: restored step {} from the {}, the newest that restores intact",
                         c.step, tier);
        }
        restored = c.step;
        return OkStatus();
      }
      // 3. `s` is the same on every rank: each branch above ends in an agreement.
      if (!SkipsTheStep(s)) return s;
      if (rank == 0) {
        Logger()->warn("mhckpt: step {} in the {} does not restore intact, skipped: {}", c.step,
                       tier, s.ToString());
      }
      skipped.push_back(fmt::format("step {} in the {}: {}", c.step, tier, s.ToString()));
    }
    // 4.
    if (skipped.empty()) {
      const bool shared_tried = options.source != RestoreSource::kLocal;
      const bool local_tried = local_ && options.source != RestoreSource::kPersistent;
      return NotFound(fmt::format(
          "no committed step{}{}{}", shared_tried ? fmt::format(" in '{}'", root_) : "",
          shared_tried && local_tried ? " nor" : "", local_tried ? " in the local tier" : ""));
    }
    return NotFound(fmt::format("no committed step restores intact: {}", fmt::join(skipped, "; ")));
  });
  callers.Finish();
  if (!done.ok()) return done;
  return restored;
}

}  // namespace internal

Result<int64_t> CheckpointManager::RestoreLatest(std::span<const ArrayToRestore> arrays,
                                                 const RestoreOptions& options) {
  return impl_->RestoreLatest(arrays, options);
}

}  // namespace mhckpt
