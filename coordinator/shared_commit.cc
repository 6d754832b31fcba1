#include "coordinator/shared_commit.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/committed_step.h"
#include "coordinator/manager_impl.h"
#include "coordinator/plan.h"
#include "io/layout.h"
#include "io/step_index.h"

namespace mhckpt::internal {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Format 3, each rank: the index records of the boxes it wrote (`sums`, in
// plan order), put at their places in the step's index file (records next to
// each other in one write) and made durable; rank 0 also writes the header.
// `sums` then hold each record's check word, for rank 0.
Status WriteIndexRecords(const std::string& path, const io::Marker& plan, int rank,
                         const io::StepWriter& writer, std::vector<BoxSum>* sums) {
  if (sums->empty() && rank != 0) return OkStatus();
  MHCKPT_ASSIGN_OR_RETURN(io::IndexLayout layout, io::IndexLayout::Of(plan, "the plan"));
  std::vector<std::pair<uint64_t, std::string>> ranges;
  if (rank == 0) ranges.emplace_back(0, io::IndexHeader(plan.step));
  for (BoxSum& b : *sums) {
    const uint64_t at = layout.offset(b.array, b.box);
    if (ranges.empty() || ranges.back().first + ranges.back().second.size() != at) {
      ranges.emplace_back(at, std::string());
    }
    std::optional<io::BoxPlace> place;
    if (plan.files > 0) {
      place = writer.Place(b.array, b.box);
      if (!place) {
        const io::MarkerArray& a = plan.arrays[b.array];
        return Internal(fmt::format("array '{}' box {}: rank {} wrote it, but not into a subfile",
                                    a.name, BoxToString(a.boxes[b.box].box), rank));
      }
    }
    b.sum = io::AppendIndexRecord(b.array, b.box, b.sum, b.chunks, &ranges.back().second, place);
    b.chunks = {};
  }
  return io::PutIndexRanges(path, ranges);
}

// What this rank writes of one save, and what it learns while writing.
struct Writes {
  const io::Marker& plan;
  const Snapshot& snapshot;
  int rank;
  bool collective;  // Transfer::kCollective: the same number of calls per array everywhere
  uint64_t written = 0;
  std::vector<BoxSum> sums;
  // After a local commit: the rank's boxes from its file of the local step
  // (the same plan, so the same boxes), instead of the snapshot.
  const StagedBoxFn* from_local = nullptr;
  // With from_local: `sums` already holds this rank's checksums (the local
  // commit took them for the same plan), so nothing is hashed twice.
  bool have_sums = false;
};

// Step 3, one array: the boxes of plan array `ai` that this rank writes.
// Keeps making every collective call after a local error, which it returns.
Status WriteArray(io::StepWriter& writer, size_t ai, const StagedArray* staged, Writes& w,
                  Status local) {
  const io::MarkerArray& a = w.plan.arrays[ai];
  std::map<int, int> writes_per_rank;
  for (const io::MarkerBox& b : a.boxes) ++writes_per_rank[b.writer];
  int calls = 0, max_calls = 0;
  for (auto [r, n] : writes_per_rank) max_calls = std::max(max_calls, n);
  for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
    const io::MarkerBox& b = a.boxes[bi];
    if (b.writer != w.rank) continue;
    ++calls;
    std::span<const std::byte> box =
        w.from_local != nullptr ? (*w.from_local)(ai, bi) : FindStaged(w.snapshot, staged, b.box);
    if (!local.ok() || box.data() == nullptr) {
      if (local.ok()) {
        local = Internal(fmt::format("array '{}' box {}: planned for rank {}, not staged there",
                                     a.name, BoxToString(b.box), w.rank));
      }
      if (w.collective) writer.WriteNothing(ai).IgnoreError();
      continue;
    }
    if (!w.have_sums) w.sums.push_back(BoxChecksums(a, ai, bi, box));
    local = writer.Write(ai, b.box, box.data());
    w.written += box.size();
    if (local.ok()) local = fault::Hit("mid_write", w.written);
  }
  for (; w.collective && calls < max_calls; ++calls) {
    Status s = writer.WriteNothing(ai);
    if (local.ok()) local = s;
  }
  return local;
}

// Step 3: this rank's boxes of every array, in plan order.
Status WriteBoxes(io::StepWriter& writer, Writes& w) {
  const auto staged = StagedByName(w.snapshot);
  Status local;
  for (size_t ai = 0; ai < w.plan.arrays.size(); ++ai) {
    auto it = staged.find(w.plan.arrays[ai].name);
    local = WriteArray(writer, ai, it == staged.end() ? nullptr : it->second, w, local);
  }
  return local;
}

}  // namespace

std::span<const std::byte> FindStaged(const Snapshot& snapshot, const StagedArray* a,
                                      const Box& box) {
  if (a == nullptr) return {};
  for (const StagedBox& sb : a->boxes) {
    if (sb.box == box) return {snapshot.data(sb), sb.size};
  }
  for (const StagedBox& sb : a->boxes) {
    if (auto run = RowRunBytes(sb.box, box, sb.size)) {
      return {snapshot.data(sb) + run->first, run->second};
    }
  }
  return {};
}

std::map<std::string_view, const StagedArray*> StagedByName(const Snapshot& snapshot) {
  std::map<std::string_view, const StagedArray*> staged;
  for (const StagedArray& a : snapshot.arrays) staged[a.name] = &a;
  return staged;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

SharedCommit::SharedCommit(const Comm& comm, SharedRoot where, SaveJob& job, io::Marker& plan,
                           const StagedBoxFn* from_local, std::vector<BoxSum> local_sums)
    : comm_(comm),
      where_(std::move(where)),
      job_(job),
      t_(job.timings),
      rank_(comm.rank()),
      plan_(plan),
      from_local_(from_local),
      local_sums_(std::move(local_sums)) {}

Status SharedCommit::Run() {
  Write();
  Flush();
  if (!local_.ok()) {
    local_ = Status(local_.code(), fmt::format("rank {}: {}", rank_, local_.message()));
  }
  Enter("commit");
  auto t0 = Clock::now();
  std::vector<std::string> reports = Agree();
  // Guarded: rank 0 must reach the broadcast below whatever happens here.
  Status s = rank_ == 0 ? Guarded("rank 0: commit", [&] { return Commit(reports); }) : OkStatus();
  if (!s.ok() && s.code() == StatusCode::kInternal && rank_ == 0) RemoveStepDir();
  s = BroadcastStatus(s, 0, comm_);
  t_.commit = Since(t0);
  if (rank_ == 0) Log(s);
  return s;
}

// 3. Write: create the step's arrays, reserve their space, write this
// rank's boxes; then give the staging buffer back.
void SharedCommit::Write() {
  Enter("write");
  auto t0 = Clock::now();
  t_.written_bytes = 0;
  Result<std::unique_ptr<io::StepWriter>> writer =
      where_.engine.Create(where_.root, job_.step, comm_);
  // Why an agreement: creating the arrays is collective; a rank that could
  // not create the step must not leave the others alone in it.
  if (!AgreeAll(writer.status(), comm_).ok()) {
    local_ = writer.status();  // the failing ranks report it in step 5
    return;
  }
  writer_ = std::move(writer).value();
  std::vector<io::ArraySpec> specs;
  specs.reserve(plan_.arrays.size());
  for (const io::MarkerArray& a : plan_.arrays) {
    io::ArraySpec& spec = specs.emplace_back(StoredSpec(a));
    const bool one = !a.boxes.empty() &&
                     std::all_of(a.boxes.begin(), a.boxes.end(), [&](const io::MarkerBox& b) {
                       return b.writer == a.boxes.front().writer;
                     });
    spec.writer = one ? a.boxes.front().writer : -1;  // a layout hint
    if (where_.options.files.ranks_per_file != 0) {
      spec.boxes.reserve(a.boxes.size());
      for (const io::MarkerBox& b : a.boxes) spec.boxes.push_back({b.box, b.writer});
    }
  }
  local_ = writer_->CreateArrays(specs);
  // With subfiles the index holds each box's place: every rank sizes the
  // index's records so.
  plan_.files = writer_->Files();
  // Where each array lies in the data file, for readers that bypass the
  // engine's per-array opens (docs/FORMAT.md); rank 0 writes the marker.
  for (size_t i = 0; local_.ok() && rank_ == 0 && i < plan_.arrays.size(); ++i) {
    plan_.arrays[i].offset = writer_->FileOffset(i);
  }
  if (ReserveEverywhere()) {
    Writes w{plan_, job_.snapshot, rank_, where_.options.transfer == Transfer::kCollective, 0,
             {},    from_local_,   false};
    if (from_local_) {
      w.sums = std::move(local_sums_);
      w.have_sums = true;
    }
    local_ = WriteBoxes(*writer_, w);
    Status finished = writer_->FinishWrites();  // before the buffer goes back
    if (local_.ok()) local_ = finished;
    t_.written_bytes = w.written;
    sums_ = std::move(w.sums);
  }
  t_.write = Since(t0);
  // Nothing reads the staged bytes after the write phase (the replica check
  // came before it, the checksums were taken while writing, and the engine
  // read its last byte in FinishWrites): give the buffer back now, so a save waiting for
  // staging memory (SaveTimings::budget_wait) need not wait for the flush
  // and the commit too (docs/PERFORMANCE.md).
  job_.snapshot.buffer = StagingBuffer();
}

// 3, before writing: rank 0 reserves the step's space on disk and all
// agree, so a full file system fails here, on every rank alike, and not
// inside a collective flush where one rank's error can strand the others.
// A rank whose array creation failed stops every rank here too.
bool SharedCommit::ReserveEverywhere() {
  Status reserved = local_;
  if ((rank_ == 0 || writer_->Files() > 0) && local_.ok()) {
    reserved = writer_->Reserve();
    local_ = reserved;  // only rank 0 reports it
  }
  return AgreeAll(reserved, comm_).ok();
}

// 4. Flush: make the step durable, and close it.
void SharedCommit::Flush() {
  if (writer_ == nullptr) return;
  auto t0 = Clock::now();
  Enter("flush");
  Status flushed = writer_->Flush();
  if (local_.ok()) local_ = flushed;
  // Format 3: this rank's index records, durable before it reports.
  if (local_.ok() && plan_.format_version >= 3) {
    local_ =
        WriteIndexRecords(io::IndexPath(where_.root, job_.step), plan_, rank_, *writer_, &sums_);
  }
  if (local_.ok()) local_ = fault::Hit("after_flush");
  t_.flush = Since(t0);
}

// 5. Agree: rank 0 learns every rank's outcome and the checksums of the
// boxes each wrote (the outcome goes to everyone after step 7).
std::vector<std::string> SharedCommit::Agree() {
  return comm_.GatherBytes(EncodeReport(local_, sums_), 0);
}

// 6. Commit (rank 0): the marker if every rank succeeded, else clean up.
Status SharedCommit::Commit(const std::vector<std::string>& reports) {
  Status s;
  if (plan_.format_version >= 3) {
    Result<io::IndexLayout> layout = io::IndexLayout::Of(plan_, "the plan");
    s = layout.ok() ? FillIndex(reports, *layout, &plan_) : layout.status();
  } else {
    s = FillChecksums(reports, &plan_);
  }
  if (s.ok() && where_.abandoned && where_.abandoned()) {
    s = IoError(
        fmt::format("step {}: the shared root's write was abandoned; no marker", job_.step));
  }
  // The names of the step's files durable before the marker's can be: with
  // only the marker's rename and the fsync after it, a file system that does
  // not journal names in order may keep the marker and lose data.h5's name
  // (found by tests/crashstate, docs/RELIABILITY.md "Crash states").
  if (s.ok()) s = where_.store.SyncStep(job_.step);
  if (s.ok()) s = fault::Hit("before_marker");
  // Again, last: in drain mode the part may have been abandoned while the
  // step synced (a stuck file system); an abandoned step gets no marker.
  if (s.ok() && where_.abandoned && where_.abandoned()) {
    s = IoError(
        fmt::format("step {}: the shared root's write was abandoned; no marker", job_.step));
  }
  if (s.ok()) {
    plan_.created_unix_ms = NowUnixMs();
    if (plan_.preemption) {
      plan_.preemption->saved_after_ms = plan_.created_unix_ms - plan_.preemption->notice_unix_ms;
    }
    const std::string text = io::MarkerToJson(plan_);
    // A marker larger than readers accept would commit a step that no
    // restore can open.
    if (text.size() > io::kMaxMarkerBytes) {
      RemoveStepDir();
      return InvalidArgument(fmt::format(
          "rank 0: the commit marker of step {} would be {} bytes, more than the {} that "
          "readers accept (too many arrays or boxes)",
          job_.step, text.size(), io::kMaxMarkerBytes));
    }
    s = where_.store.PutMarker(plan_, text);
    if (!s.ok()) s = Status(s.code(), fmt::format("rank 0: commit marker: {}", s.message()));
  }
  if (!s.ok()) RemoveStepDir();
  return s;
}

void SharedCommit::Log(const Status& s) const {
  if (!s.ok()) {
    Logger()->error("mhckpt: step {} failed: {}", job_.step, s.ToString());
    return;
  }
  Logger()->info(
      "mhckpt: step {} committed: {:.1f} MiB in {:.3f} s (budget wait {:.3f}, snapshot {:.3f}, "
      "plan {:.3f}{}, write {:.3f}, flush {:.3f}, commit {:.3f})",
      job_.step, static_cast<double>(plan_.total_bytes) / (1 << 20),
      t_.budget_wait + t_.snapshot + t_.plan + t_.write + t_.flush + t_.commit, t_.budget_wait,
      t_.snapshot, t_.plan, t_.plan_cached ? " cached" : "", t_.write, t_.flush, t_.commit);
  if (const auto& p = plan_.preemption) {
    const double after = static_cast<double>(p->saved_after_ms) / 1000;
    if (p->grace_ms > 0) {
      Logger()->info("mhckpt: step {} saved for preemption: {:.3f} s of a {:g} s grace period",
                     job_.step, after, static_cast<double>(p->grace_ms) / 1000);
    } else {
      Logger()->info(
          "mhckpt: step {} saved for preemption: {:.3f} s after the notice (grace period unknown)",
          job_.step, after);
    }
  }
}

void SharedCommit::RemoveStepDir() const { where_.store.RemoveStep(job_.step).IgnoreError(); }

void SharedCommit::Enter(const char* phase) {
  if (where_.watchdog != nullptr) where_.watchdog->Enter(phase, job_.step);
}

}  // namespace mhckpt::internal
