// Steps 3-6 of the save protocol (coordinator/save.cc): the shared root's
// part of one save on one rank — write, flush (and the format-3 index),
// agree, commit. A SharedCommit runs with the communicator it is given: the
// I/O thread's, or in drain mode the drain thread's (SaveRun::Drain), each
// its own object; nothing swaps a communicator under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/comm.h"
#include "base/status.h"
#include "coordinator/checkpoint_manager.h"
#include "coordinator/local_tier.h"
#include "coordinator/rank_report.h"
#include "coordinator/watchdog.h"
#include "io/marker.h"
#include "io/root_store.h"
#include "io/storage.h"
#include "worker/snapshot.h"

namespace mhckpt::internal {

struct SaveJob;  // coordinator/manager_impl.h

/// The staged bytes of planned box `box` of `a`: a staged box equal to it, or
/// (replica-parallel saving, plan.h) a staged box of which `box` is a run of
/// whole rows. Empty if this rank holds no such box.
std::span<const std::byte> FindStaged(const Snapshot& snapshot, const StagedArray* a,
                                      const Box& box);
std::map<std::string_view, const StagedArray*> StagedByName(const Snapshot& snapshot);
int64_t NowUnixMs();

/// Where, and under which bounds, the shared root's part of a save runs.
struct SharedRoot {
  io::Engine& engine;
  const std::string& root;
  io::RootStore& store;
  const Options& options;
  /// Bounds each collective phase; null on the drain thread, whose bound is
  /// Options::persistent_deadline_seconds.
  Watchdog* watchdog = nullptr;
  /// Drain mode: whether this step's part has been abandoned (no marker then).
  std::function<bool()> abandoned;
};

class SharedCommit {
 public:
  /// `plan` is the save's (step 6 fills its checksums, files and offsets);
  /// `from_local`, after a local commit: this rank's boxes from its file of
  /// the local step instead of job.snapshot, with `local_sums` their
  /// checksums (the local commit took them for the same plan).
  SharedCommit(const Comm& comm, SharedRoot where, SaveJob& job, io::Marker& plan,
               const StagedBoxFn* from_local, std::vector<BoxSum> local_sums);

  /// Steps 3-6, collective on `comm`: every rank returns the commit's outcome.
  Status Run();

 private:
  void Write();
  bool ReserveEverywhere();
  void Flush();
  std::vector<std::string> Agree();
  Status Commit(const std::vector<std::string>& reports);
  void Log(const Status& s) const;
  void RemoveStepDir() const;
  void Enter(const char* phase);

  const Comm& comm_;
  SharedRoot where_;
  SaveJob& job_;
  SaveTimings& t_;
  const int rank_;
  io::Marker& plan_;
  const StagedBoxFn* from_local_;
  std::vector<BoxSum> local_sums_;
  std::unique_ptr<io::StepWriter> writer_;  // from step 3 on, if the engine created the step
  Status local_;                            // this rank's first error from step 3 on
  std::vector<BoxSum> sums_;                // of the boxes this rank wrote
};

}  // namespace mhckpt::internal
