// The save protocol of one step, run by every rank on its I/O thread after
// Save has copied the rank's boxes into a Snapshot:
//
//   1. Plan. If every rank holds exactly the arrays and boxes of the
//      previous save, one allreduce confirms it (and that all ranks save the
//      same step) and the previous plan is reused. Otherwise every rank sends
//      rank 0 a description of what it holds (and its local input error, if
//      any); rank 0 validates all of them together, picks one writer per
//      distinct box (coordinator/plan.h), refuses a step that is already
//      committed, creates the step directory (fsyncing the root), and
//      broadcasts the outcome and the plan. Either collective is also the
//      barrier of the design: a rank enters it only after its snapshot is
//      complete, so nobody writes before every snapshot exists.
//   2. Write. All ranks create the HDF5 file and every dataset collectively;
//      each rank writes the boxes the plan gives it (fully replicated arrays:
//      rank 0). A write error is remembered, and the rank keeps taking part.
//   3. Durable. H5Fflush(GLOBAL) syncs the file through MPI-IO; then close.
//   4. Agree. One allreduce: did every rank succeed?
//   5. Commit. Rank 0 writes the marker (io::WriteFileAtomic: temp file,
//      fsync, rename, fsync the directory), or on failure removes the step
//      directory. It broadcasts the outcome; every rank returns it.
//   6. Retention. Before broadcasting the outcome, rank 0 deletes the steps
//      the policy no longer keeps (marker first, io::DeleteStep). A failure
//      here is logged, not returned: the new step is committed either way.
//
// A crash anywhere before step 5 leaves a directory without a marker, which
// is never listed and is removed by the next Open.
#include <chrono>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "coordinator/agree.h"
#include "coordinator/manager_impl.h"
#include "coordinator/plan.h"
#include "coordinator/retention.h"
#include "io/catalog.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/posix_file.h"

namespace mhckpt {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Rank 0: refuses a committed step, and creates its directory afresh (a
// directory left by an earlier failed attempt at this step is garbage).
Status PrepareStepDir(const std::string& root, int64_t step) {
  if (io::PathExists(io::MarkerPath(root, step))) {
    return AlreadyExists(fmt::format("step {} is already committed in '{}'", step, root));
  }
  MHCKPT_RETURN_IF_ERROR(io::RemoveAll(io::StepDir(root, step)));
  MHCKPT_RETURN_IF_ERROR(io::MakeDirs(io::StepDir(root, step)));
  return io::FsyncDir(root);
}

// Rank 0's part of the plan round.
Result<io::Marker> PlanOnRoot(const std::vector<std::string>& encoded, const std::string& root,
                              int64_t step) {
  std::vector<RankDescription> ranks;
  for (const std::string& e : encoded) {
    MHCKPT_ASSIGN_OR_RETURN(RankDescription d, DecodeDescription(e));
    ranks.push_back(std::move(d));
  }
  MHCKPT_ASSIGN_OR_RETURN(io::Marker plan, BuildPlan(ranks));
  MHCKPT_RETURN_IF_ERROR(PrepareStepDir(root, step));
  return plan;
}

// What a rank holds, independent of the step: equal hashes, equal plans.
uint64_t DescriptionHash(const Snapshot& snapshot) {
  std::string bytes = EncodeDescription(Describe(0, OkStatus(), snapshot));
  return XXH3_64bits(bytes.data(), bytes.size());
}

// Step 2: create every dataset and write this rank's boxes. Returns the first
// local error; keeps making every collective call after one.
Status WriteArrays(io::H5File& file, const io::Marker& plan, const Snapshot& snapshot, int rank,
                   Transfer transfer, uint64_t* written) {
  std::map<std::string_view, const StagedArray*> staged;
  for (const StagedArray& a : snapshot.arrays) staged[a.name] = &a;
  Status local;
  for (const io::MarkerArray& a : plan.arrays) {
    Result<io::Dataset> ds = file.CreateDataset(a.name, a.dtype, a.shape);
    if (!ds.ok()) {
      if (local.ok()) local = ds.status();
      continue;
    }
    // Collective transfers need the same number of calls on every rank.
    std::map<int, int> writes_per_rank;
    for (const io::MarkerBox& b : a.boxes) ++writes_per_rank[b.writer];
    int calls = 0, max_calls = 0;
    for (auto [r, n] : writes_per_rank) max_calls = std::max(max_calls, n);
    for (const io::MarkerBox& b : a.boxes) {
      if (b.writer != rank) continue;
      ++calls;
      const StagedBox* box = nullptr;
      for (const StagedBox& sb : staged.at(a.name)->boxes) {
        if (sb.box == b.box) box = &sb;
      }
      if (!local.ok() || box == nullptr) {
        if (local.ok()) {
          local = Internal(fmt::format("array '{}' box {}: planned for rank {}, not staged there",
                                       a.name, BoxToString(b.box), rank));
        }
        if (transfer == Transfer::kCollective) ds->WriteNothing().IgnoreError();
        continue;
      }
      local = ds->Write(b.box, snapshot.data(*box));
      *written += box->size;
    }
    if (transfer == Transfer::kCollective) {
      for (; calls < max_calls; ++calls) {
        Status s = ds->WriteNothing();
        if (local.ok()) local = s;
      }
    }
  }
  return local;
}

}  // namespace

Status CheckpointManager::Impl::CommitSave(SaveJob& job) {
  const int rank = comm_.rank();
  SaveTimings& t = job.timings;

  // 1. Plan: reuse the previous one if every rank holds what it held then.
  auto t0 = Clock::now();
  io::Marker plan;
  const uint64_t hash = job.local.ok() ? DescriptionHash(job.snapshot) : 0;
  int64_t changed = last_plan_ && job.local.ok() && hash == last_description_hash_ ? 0 : 1;
  if (rank == 0 && !changed && !PrepareStepDir(root_, job.step).ok()) changed = 1;
  // Why one allreduce: it confirms that nobody's arrays changed and that all
  // ranks save the same step (max(step) == -max(-step)).
  std::vector<int64_t> votes{changed, job.step, -job.step};
  comm_.AllreduceMax(&votes);
  t.plan_cached = votes[0] == 0 && votes[1] == -votes[2];
  if (t.plan_cached) {
    plan = *last_plan_;
    plan.step = job.step;
  } else {
    if (rank == 0 && !changed) io::RemoveAll(io::StepDir(root_, job.step)).IgnoreError();
    std::vector<std::string> encoded =
        comm_.GatherBytes(EncodeDescription(Describe(job.step, job.local, job.snapshot)), 0);
    Status s;
    std::string plan_json;
    if (rank == 0) {
      Result<io::Marker> p = PlanOnRoot(encoded, root_, job.step);
      s = p.status();
      if (p.ok()) {
        plan = std::move(p).value();
        plan_json = io::MarkerToJson(plan);
      }
    }
    s = BroadcastStatus(s, 0, comm_);
    if (!s.ok()) return s;
    comm_.BroadcastBytes(&plan_json, 0);
    if (rank != 0) {
      Result<io::Marker> p = io::ParseMarker(plan_json, "plan");
      if (!p.ok()) {
        return Internal(
            fmt::format("rank {}: cannot read rank 0's plan: {}", rank, p.status().message()));
      }
      plan = std::move(p).value();
    }
    last_plan_ = plan;
    last_description_hash_ = hash;
  }
  plan.user_metadata = job.metadata;  // rank 0's is the one written
  t.plan = Since(t0);

  // 2. Write, and 3. make durable.
  t0 = Clock::now();
  Status local;
  t.written_bytes = 0;
  Result<io::H5File> file =
      io::H5File::Create(io::DataPath(root_, job.step), comm_.get(), options_.transfer);
  if (!file.ok()) {
    local = file.status();
  } else {
    local = WriteArrays(*file, plan, job.snapshot, rank, options_.transfer, &t.written_bytes);
    t.write = Since(t0);
    t0 = Clock::now();
    Status closed = file->FlushAndClose();
    if (local.ok()) local = closed;
    t.flush = Since(t0);
  }
  if (!local.ok()) local = Status(local.code(), fmt::format("rank {}: {}", rank, local.message()));

  // 4. Agree: every rank's write and flush succeeded, or all learn who failed.
  t0 = Clock::now();
  Status s = AgreeAll(local, comm_);

  // 5. Commit (or clean up), on rank 0, then tell everyone.
  if (rank == 0) {
    if (s.ok()) {
      plan.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
      s = io::WriteFileAtomic(io::MarkerPath(root_, job.step), io::MarkerToJson(plan));
      if (!s.ok()) s = Status(s.code(), fmt::format("rank 0: commit marker: {}", s.message()));
    }
    if (!s.ok()) io::RemoveAll(io::StepDir(root_, job.step)).IgnoreError();
  }
  // 6. Retention, before the outcome goes out: when WaitUntilFinished
  // returns anywhere, the deleted steps are gone everywhere.
  auto gc0 = Clock::now();
  if (rank == 0 && s.ok() && options_.max_to_keep > 0) {
    Result<std::vector<int64_t>> committed = io::CommittedSteps(root_);
    Status gc = committed.status();
    if (committed.ok()) {
      for (int64_t old : StepsToDelete(*committed, options_.max_to_keep, options_.keep_period)) {
        gc = io::DeleteStep(root_, old);
        if (!gc.ok()) break;
      }
    }
    if (!gc.ok()) spdlog::warn("mhckpt: retention after step {}: {}", job.step, gc.ToString());
  }
  t.gc = Since(gc0);
  s = BroadcastStatus(s, 0, comm_);
  t.commit = Since(t0) - t.gc;

  if (rank == 0) {
    if (s.ok()) {
      spdlog::info(
          "mhckpt: step {} committed: {:.1f} MiB in {:.3f} s (budget wait {:.3f}, snapshot {:.3f}, "
          "plan {:.3f}{}, write {:.3f}, flush {:.3f}, commit {:.3f}, gc {:.3f})",
          job.step, static_cast<double>(plan.total_bytes) / (1 << 20),
          t.budget_wait + t.snapshot + t.plan + t.write + t.flush + t.commit + t.gc, t.budget_wait,
          t.snapshot, t.plan, t.plan_cached ? " cached" : "", t.write, t.flush, t.commit, t.gc);
    } else {
      spdlog::error("mhckpt: step {} failed: {}", job.step, s.ToString());
    }
  }
  return s;
}

}  // namespace mhckpt
