// mhckpt gc ROOT --keep N: deletes old committed steps and the directories of
// uncommitted ones.
#pragma once

#include <cstdio>
#include <string>

#include "base/status.h"

namespace mhckpt::cli {

struct GcArgs {
  std::string root;
  int keep = 1;        ///< committed steps to keep (the newest)
  bool force = false;  ///< also delete uncommitted steps newer than the newest committed one
  bool dry_run = false;
};

/// Deletes every committed step but the newest `keep`, and every uncommitted
/// step directory (including ones with an invalid marker) older than the
/// newest committed step, each with io::RootStore::DeleteStep (marker
/// first). An uncommitted step newer than that may be a save in progress:
/// it is kept unless `force`. First it takes the root's lock as a job's Open
/// does (io/root_store.h, rule 5), without waiting: FailedPrecondition, and
/// nothing deleted, while a job holds the root; it lists the steps only once
/// it holds the root. A dry run takes no lock and deletes nothing. Prints
/// what it does to `out`. Not collective: run it as one process.
Status RunGc(const GcArgs& args, std::FILE* out);

}  // namespace mhckpt::cli
