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
//      rank 0 reserves the file's space on disk (posix_fallocate) and all
//      agree on it, so a full disk fails here and not inside a collective
//      flush; then each rank writes the boxes the plan gives it (fully
//      replicated arrays: rank 0; with Options::replica_parallel_min_bytes,
//      big shared boxes as row slices, one per holder, each from the
//      holder's own staged copy). A write error is remembered, and the rank
//      keeps taking part. The staging buffer goes back to the pool as soon
//      as the rank's writes are done.
//   3. Durable. H5Fflush(GLOBAL) syncs the file through MPI-IO; then close.
//   4. Agree. One gather: every rank's outcome, and the checksums (XXH3) of
//      the boxes it wrote, which go into the marker.
//   5. Commit. Rank 0 writes the marker (io::WriteFileAtomic: temp file,
//      fsync, rename, fsync the directory), or on failure removes the step
//      directory. It broadcasts the outcome; every rank returns it.
//   6. Retention. Before broadcasting the outcome, rank 0 deletes the steps
//      the policy no longer keeps (marker first, io::DeleteStep). A failure
//      here is logged, not returned: the new step is committed either way.
//
// A crash anywhere before step 5 leaves a directory without a marker, which
// is never listed and is removed by the next Open.
#include <algorithm>
#include <chrono>
#include <map>
#include <span>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "base/fault.h"

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
// The plan uses rank 0's Options::replica_parallel_min_bytes: the plan is
// made here and broadcast, so a different value on another rank is ignored.
Result<io::Marker> PlanOnRoot(const std::vector<std::string>& encoded, const std::string& root,
                              int64_t step, uint64_t replica_parallel_min_bytes) {
  std::vector<RankDescription> ranks;
  for (const std::string& e : encoded) {
    MHCKPT_ASSIGN_OR_RETURN(RankDescription d, DecodeDescription(e));
    ranks.push_back(std::move(d));
  }
  MHCKPT_ASSIGN_OR_RETURN(io::Marker plan, BuildPlan(ranks, replica_parallel_min_bytes));
  MHCKPT_RETURN_IF_ERROR(PrepareStepDir(root, step));
  return plan;
}

// What a rank holds, independent of the step: equal hashes, equal plans.
// Streamed over the snapshot's fields (no encoded description: with 10,000
// arrays that cost more than the rest of a cached plan round). Every field is
// preceded by its length, so different holdings give different byte streams.
uint64_t DescriptionHash(const Snapshot& snapshot) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) {  // out of memory: the old, allocating way
    std::string bytes = EncodeDescription(Describe(0, OkStatus(), snapshot));
    return XXH3_64bits(bytes.data(), bytes.size());
  }
  XXH3_64bits_reset(state);
  auto add = [&](const void* p, size_t n) { XXH3_64bits_update(state, p, n); };
  auto add_size = [&](uint64_t n) { add(&n, sizeof n); };
  auto add_ints = [&](const std::vector<int64_t>& v) {
    add_size(v.size());
    add(v.data(), v.size() * sizeof(int64_t));
  };
  add_size(snapshot.arrays.size());
  for (const StagedArray& a : snapshot.arrays) {
    add_size(a.name.size());
    add(a.name.data(), a.name.size());
    add_size(static_cast<uint64_t>(a.dtype));
    add_ints(a.shape);
    add_size(a.boxes.size());
    for (const StagedBox& b : a.boxes) {
      add_ints(b.box.start);
      add_ints(b.box.count);
    }
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

// Step 2: create every dataset and write this rank's boxes. Returns the first
// local error; keeps making every collective call after one.
// The checksum of box `box` of array `array` (indices into the plan).
struct BoxSum {
  uint32_t array;
  uint32_t box;
  uint64_t sum;
};

// What a rank tells rank 0 after a phase: its status and the checksums of the
// boxes it hashed.
std::string EncodeReport(const Status& s, const std::vector<BoxSum>& sums) {
  nlohmann::json j =
      nlohmann::json::array({static_cast<int>(s.code()), s.message(), nlohmann::json::array()});
  for (const BoxSum& b : sums) j[2].push_back({b.array, b.box, b.sum});
  std::vector<uint8_t> cbor = nlohmann::json::to_cbor(j);
  return {cbor.begin(), cbor.end()};
}

Status DecodeReport(const std::string& bytes, std::vector<BoxSum>* sums) {
  try {
    nlohmann::json j = nlohmann::json::from_cbor(bytes);
    for (const auto& b : j.at(2)) {
      sums->push_back(
          BoxSum{b.at(0).get<uint32_t>(), b.at(1).get<uint32_t>(), b.at(2).get<uint64_t>()});
    }
    return Status(static_cast<StatusCode>(j.at(0).get<int>()), j.at(1).get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    return Internal(fmt::format("cannot decode a rank's report: {}", e.what()));
  }
}

// The first error of `reports` (lowest rank), noting how many ranks failed;
// fills `sums` from every rank.
Status CollectReports(const std::vector<std::string>& reports,
                      std::vector<std::vector<BoxSum>>* sums) {
  Status first;
  int failed = 0;
  sums->assign(reports.size(), {});
  for (size_t r = 0; r < reports.size(); ++r) {
    Status s = DecodeReport(reports[r], &(*sums)[r]);
    if (!s.ok() && failed++ == 0) first = s;
  }
  if (failed > 1) {
    return {first.code(), fmt::format("{} (and {} more rank{} failed)", first.message(), failed - 1,
                                      failed > 2 ? "s" : "")};
  }
  return first;
}

// The staged bytes of planned box `box` of `a`: a staged box equal to it, or
// (replica-parallel saving, plan.h) a staged box of which `box` is a slice of
// whole rows (same extent in every dimension but the first), whose bytes are
// contiguous in row-major order. Empty if this rank holds no such box.
std::span<const std::byte> FindStaged(const Snapshot& snapshot, const StagedArray* a,
                                      const Box& box) {
  if (a == nullptr) return {};
  for (const StagedBox& sb : a->boxes) {
    if (sb.box == box) return {snapshot.data(sb), sb.size};
  }
  for (const StagedBox& sb : a->boxes) {
    const size_t dims = sb.box.count.size();
    if (dims == 0 || box.count.size() != dims || sb.box.count[0] == 0) continue;
    if (!std::equal(sb.box.start.begin() + 1, sb.box.start.end(), box.start.begin() + 1) ||
        !std::equal(sb.box.count.begin() + 1, sb.box.count.end(), box.count.begin() + 1) ||
        box.start[0] < sb.box.start[0] ||
        box.start[0] + box.count[0] > sb.box.start[0] + sb.box.count[0]) {
      continue;
    }
    const size_t row_bytes = sb.size / static_cast<size_t>(sb.box.count[0]);
    return {snapshot.data(sb) + static_cast<size_t>(box.start[0] - sb.box.start[0]) * row_bytes,
            static_cast<size_t>(box.count[0]) * row_bytes};
  }
  return {};
}

// Checksums of every planned box this rank holds, written by it or not
// (Options::verify_replicas). A box split into row slices (replica-parallel
// saving) is compared slice by slice: every holder of the box holds every
// slice, so all of the box is compared across all of its holders.
std::vector<BoxSum> HoldingChecksums(const io::Marker& plan, const Snapshot& snapshot) {
  std::map<std::string_view, const StagedArray*> staged;
  for (const StagedArray& a : snapshot.arrays) staged[a.name] = &a;
  std::vector<BoxSum> sums;
  for (size_t i = 0; i < plan.arrays.size(); ++i) {
    auto it = staged.find(plan.arrays[i].name);
    for (size_t k = 0; it != staged.end() && k < plan.arrays[i].boxes.size(); ++k) {
      std::span<const std::byte> bytes =
          FindStaged(snapshot, it->second, plan.arrays[i].boxes[k].box);
      if (bytes.data() != nullptr) {
        sums.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(k),
                        Checksum(bytes.data(), bytes.size())});
      }
    }
  }
  return sums;
}

// Rank 0: the boxes held by several ranks must be equal everywhere.
Status CompareReplicas(const io::Marker& plan, const std::vector<std::vector<BoxSum>>& sums) {
  std::map<std::pair<uint32_t, uint32_t>, std::pair<uint64_t, int>> first;  // box -> (sum, rank)
  for (size_t r = 0; r < sums.size(); ++r) {
    for (const BoxSum& b : sums[r]) {
      auto [it, inserted] = first.try_emplace({b.array, b.box}, b.sum, static_cast<int>(r));
      if (!inserted && it->second.first != b.sum) {
        const io::MarkerArray& a = plan.arrays[b.array];
        return DataLoss(
            fmt::format("replicas differ: array '{}' box {} is {} on rank {} but {} on rank {}",
                        a.name, BoxToString(a.boxes[b.box].box), ChecksumToString(it->second.first),
                        it->second.second, ChecksumToString(b.sum), r));
      }
    }
  }
  return OkStatus();
}

// Step 2a (collective): every dataset of the plan, in plan order. Stops at
// the first failure, which every rank meets alike (creation is collective).
Status CreateDatasets(io::H5File& file, const io::Marker& plan, std::vector<io::Dataset>* out) {
  for (const io::MarkerArray& a : plan.arrays) {
    MHCKPT_ASSIGN_OR_RETURN(io::Dataset ds, file.CreateDataset(a.name, a.dtype, a.shape));
    out->push_back(std::move(ds));
  }
  return OkStatus();
}

// Step 2c: this rank's boxes. Returns the first local error; keeps making
// every collective call after one.
Status WriteBoxes(std::vector<io::Dataset>& datasets, const io::Marker& plan,
                  const Snapshot& snapshot, int rank, Transfer transfer, uint64_t* written,
                  std::vector<BoxSum>* sums) {
  std::map<std::string_view, const StagedArray*> staged;
  for (const StagedArray& a : snapshot.arrays) staged[a.name] = &a;
  Status local;
  for (size_t ai = 0; ai < plan.arrays.size(); ++ai) {
    const io::MarkerArray& a = plan.arrays[ai];
    io::Dataset& ds = datasets[ai];
    // Collective transfers need the same number of calls on every rank.
    std::map<int, int> writes_per_rank;
    for (const io::MarkerBox& b : a.boxes) ++writes_per_rank[b.writer];
    int calls = 0, max_calls = 0;
    for (auto [r, n] : writes_per_rank) max_calls = std::max(max_calls, n);
    for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
      const io::MarkerBox& b = a.boxes[bi];
      if (b.writer != rank) continue;
      ++calls;
      std::span<const std::byte> box = FindStaged(snapshot, staged[a.name], b.box);
      if (!local.ok() || box.data() == nullptr) {
        if (local.ok()) {
          local = Internal(fmt::format("array '{}' box {}: planned for rank {}, not staged there",
                                       a.name, BoxToString(b.box), rank));
        }
        if (transfer == Transfer::kCollective) ds.WriteNothing().IgnoreError();
        continue;
      }
      sums->push_back(
          {static_cast<uint32_t>(ai), static_cast<uint32_t>(bi), Checksum(box.data(), box.size())});
      local = ds.Write(b.box, box.data());
      *written += box.size();
      if (local.ok()) local = fault::Hit("mid_write", *written);
    }
    if (transfer == Transfer::kCollective) {
      for (; calls < max_calls; ++calls) {
        Status s = ds.WriteNothing();
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
  // Each phase is bounded in time (Options::collective_timeout_seconds).
  Watchdog::Guard phase(watchdog_, "plan", job.step);
  fault::SetStep(job.step);
  if (job.local.ok()) job.local = fault::Hit("plan");

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
    std::vector<std::string> encoded = comm_.GatherBytes(
        EncodeDescription(mhckpt::Describe(job.step, job.local, job.snapshot)), 0);
    Status s;
    std::string plan_json;
    if (rank == 0) {
      Result<io::Marker> p =
          PlanOnRoot(encoded, root_, job.step, options_.replica_parallel_min_bytes);
      s = p.status();
      if (s.code() == StatusCode::kIoError) {
        s = Status(s.code(), fmt::format("rank 0: {}", s.message()));
        io::RemoveAll(io::StepDir(root_, job.step)).IgnoreError();
      }
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

  // 1b. Optionally, replicas must agree before anything is written.
  if (options_.verify_replicas) {
    std::vector<std::string> held =
        comm_.GatherBytes(EncodeReport(OkStatus(), HoldingChecksums(plan, job.snapshot)), 0);
    Status s;
    if (rank == 0) {
      std::vector<std::vector<BoxSum>> all;
      s = CollectReports(held, &all);
      if (s.ok()) s = CompareReplicas(plan, all);
      if (!s.ok()) io::RemoveAll(io::StepDir(root_, job.step)).IgnoreError();
    }
    MHCKPT_RETURN_IF_ERROR(BroadcastStatus(s, 0, comm_));
  }
  t.plan = Since(t0);

  // 2. Write, and 3. make durable.
  watchdog_.Enter("write", job.step);
  t0 = Clock::now();
  Status local;
  std::vector<BoxSum> sums;
  t.written_bytes = 0;
  Result<io::H5File> file =
      io::H5File::Create(io::DataPath(root_, job.step), comm_.get(), options_.transfer);
  if (!file.ok()) {
    local = file.status();
  } else {
    std::vector<io::Dataset> datasets;
    local = CreateDatasets(*file, plan, &datasets);
    // 2b. Reserve the file's space on disk up front (rank 0, agreed), so a
    // full file system fails here, on every rank alike, and not inside a
    // collective HDF5 flush where one rank's error can strand the others.
    bool reserved_everywhere = false;
    if (local.ok()) {
      Status reserved;
      if (rank == 0) {
        uint64_t end = 0;
        for (const io::Dataset& d : datasets) end = std::max(end, d.EndInFile());
        // The slack covers metadata written after the last dataset.
        reserved = io::Preallocate(io::DataPath(root_, job.step), end + end / 100 + (1u << 20));
        local = reserved;  // only rank 0 reports it
      }
      reserved_everywhere = AgreeAll(reserved, comm_).ok();
    }
    if (reserved_everywhere) {
      local = WriteBoxes(datasets, plan, job.snapshot, rank, options_.transfer, &t.written_bytes,
                         &sums);
    }
    datasets.clear();
    t.write = Since(t0);
    // Nothing reads the staged bytes after the write phase (the replica check
    // came before it, the checksums were taken while writing, and H5Dwrite
    // does not keep the buffer): give the buffer back now, so a save waiting
    // for staging memory (SaveTimings::budget_wait) need not wait for the
    // flush and the commit too (docs/PERFORMANCE.md).
    job.snapshot.buffer = StagingBuffer();
    t0 = Clock::now();
    watchdog_.Enter("flush", job.step);
    Status closed = file->FlushAndClose();
    if (local.ok()) local = closed;
    if (local.ok()) local = fault::Hit("after_flush");
    t.flush = Since(t0);
  }
  if (!local.ok()) local = Status(local.code(), fmt::format("rank {}: {}", rank, local.message()));

  watchdog_.Enter("commit", job.step);
  // 4. Agree: rank 0 learns every rank's outcome and the checksums of the
  // boxes each wrote (the outcome goes to everyone with step 5's broadcast).
  t0 = Clock::now();
  std::vector<std::string> reports = comm_.GatherBytes(EncodeReport(local, sums), 0);
  Status s;

  // 5. Commit (or clean up), on rank 0, then tell everyone.
  if (rank == 0) {
    std::vector<std::vector<BoxSum>> all;
    s = CollectReports(reports, &all);
    for (const auto& rank_sums : all) {
      for (const BoxSum& b : rank_sums) plan.arrays[b.array].boxes[b.box].checksum = b.sum;
    }
    // The space reserved in step 2 beyond what HDF5 used goes back.
    if (s.ok()) s = io::TrimToRecordedEnd(io::DataPath(root_, job.step));
    if (s.ok()) s = fault::Hit("before_marker");
    if (s.ok()) {
      plan.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
      const std::string text = io::MarkerToJson(plan);
      s = io::WriteFileAtomic(io::MarkerPath(root_, job.step), text);
      if (s.ok()) io::RememberValidMarker(root_, plan, text);
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
