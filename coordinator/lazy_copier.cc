#include "coordinator/lazy_copier.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/guard.h"
#include "base/log.h"
#include "coordinator/manager_impl.h"
#include "coordinator/rank_report.h"
#include "io/marker.h"

namespace mhckpt::internal {

void FenceState::Complete(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
  }
  cv.notify_all();
}

Status FenceState::Wait() {
  if (shared) shared->Help();
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [this] { return done; });
  return status;
}

bool FenceState::Done() {
  std::lock_guard<std::mutex> lock(mu);
  return done;
}

std::vector<WriteWatch::Range> WatchRanges(const std::vector<SnapshotCopy>& copies,
                                           const Snapshot& snapshot, int rank, int64_t step) {
  std::vector<WriteWatch::Range> ranges;
  for (const SnapshotCopy& c : copies) {
    if (c.memory != Memory::kHost || c.size == 0) continue;
    ranges.push_back({c.src, c.size,
                      fmt::format("mhckpt: rank {} wrote to array '{}', box {}, while the lazy "
                                  "save of step {} was still copying it (wait on the save's "
                                  "fence first; SaveOptions::protect_host); aborting\n",
                                  rank, snapshot.arrays[c.array].name, BoxToString(c.box), step)});
  }
  return ranges;
}

namespace {

// Places the boxes in the buffer array by array in name order (the plan's),
// each array's boxes as staged.
void OrderByName(Snapshot* snapshot, std::vector<SnapshotCopy>* copies) {
  std::vector<size_t> order(snapshot->arrays.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return snapshot->arrays[a].name < snapshot->arrays[b].name;
  });
  size_t at = 0;
  for (size_t i : order) {
    for (StagedBox& b : snapshot->arrays[i].boxes) {
      b.offset = at;
      at += b.size;
    }
  }
  for (SnapshotCopy& c : *copies) c.offset = snapshot->arrays[c.array].boxes[c.staged].offset;
}

// The boxes in the landing file's order, each host copy hashing its box on
// the way in the chunks the plan will give it.
void PlaceForLanding(const ManagerImpl& impl, Snapshot* snapshot,
                     std::vector<SnapshotCopy>* copies) {
  OrderByName(snapshot, copies);
  const uint64_t chunk_bytes = impl.options().checksum_chunk_bytes > 0
                                   ? impl.options().checksum_chunk_bytes
                                   : io::kChunkBytes;  // as the plan (coordinator/plan.h)
  for (SnapshotCopy& c : *copies) {
    if (c.memory != Memory::kHost || c.size == 0) continue;
    io::MarkerBox b;
    b.box = c.box;
    b.chunk_rows = io::ChunkRows(c.box, snapshot->arrays[c.array].dtype, chunk_bytes);
    c.hash_chunk_bytes = BoxChunkBytes(b, c.size);
  }
}

}  // namespace

bool AcquireWarmLanding(ManagerImpl& impl, Snapshot* snapshot, std::vector<SnapshotCopy>* copies) {
  const LocalTier* local = impl.local_tier();
  LandingFile* landing = local != nullptr ? local->landing() : nullptr;
  if (landing == nullptr || snapshot->total_bytes == 0) return false;
  std::optional<StagingBuffer> buffer =
      landing->TryAcquire(snapshot->total_bytes, /*warm_only=*/true);
  if (!buffer) return false;
  PlaceForLanding(impl, snapshot, copies);
  snapshot->buffer = std::move(*buffer);
  return true;
}

Status AcquireLazyStaging(ManagerImpl& impl, const SnapshotOptions& options, Snapshot* snapshot,
                          std::vector<SnapshotCopy>* copies) {
  const LocalTier* local = impl.local_tier();
  LandingFile* landing = local != nullptr ? local->landing() : nullptr;
  if (landing == nullptr || snapshot->total_bytes == 0) {
    return AcquireStaging(options, impl.pool(), snapshot);
  }
  PlaceForLanding(impl, snapshot, copies);
  Result<StagingBuffer> buffer =
      landing->Acquire(snapshot->total_bytes, &snapshot->budget_wait_seconds);
  if (!buffer.ok()) {
    // No landing file (e.g. the local dir is full): staging from the pool;
    // the local write reports what it finds.
    Logger()->warn("mhckpt: rank {}: {}; staging in memory instead", options.rank,
                   buffer.status().ToString());
    return AcquireStaging(options, impl.pool(), snapshot);
  }
  snapshot->buffer = std::move(buffer).value();
  return OkStatus();
}

bool LazyCopier::Start(const std::shared_ptr<LazyCopier>& copier) {
  SaveJob* job = copier->job_;
  // A caller waiting on the fence copies the boxes not yet taken itself.
  copier->parts_.options.shared = std::make_shared<SharedCopies>();
  copier->parts_.fence->shared = copier->parts_.options.shared;
  if (fault::Hit("copier_thread").ok()) {  // a test's stand-in for a refused thread
    try {
      job->copier = std::thread([copier] { copier->Copy(true); });
      return true;
    } catch (const std::system_error&) {
    }
  }
  copier->Copy(false);  // no thread to be had: copy here, at the caller's priority
  return false;
}

void LazyCopier::Copy(bool own_thread) {
  // On a thread of its own, the lowest priority (its copy threads inherit
  // it): on busy cores the copy yields to the caller's compute; a caller
  // waiting on the fence leaves it the core. Never on the caller's thread,
  // whose priority is the caller's (and, unprivileged, could not be
  // raised back).
  if (own_thread) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
  fault::SetStep(job_->step);  // per thread: a test's fault at lazy_copy names its save
  auto start = std::chrono::steady_clock::now();
  Status s = Guarded(parts_.where, [&] {
    MHCKPT_RETURN_IF_ERROR(fault::Hit("lazy_copy"));
    return CopyIntoSnapshot(parts_.copies, parts_.options, OkStatus(), &job_->snapshot,
                            parts_.mark.get());
  });
  parts_.mark->Reset();  // the events, once the copies that waited on them have ended
  parts_.watch->Release();
  // The budget was waited for in Save, before this copy started.
  job_->timings.budget_wait = job_->snapshot.budget_wait_seconds;
  job_->timings.snapshot =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.ok() && parts_.check_after_copy) s = Guarded(parts_.where, parts_.check_after_copy);
  if (job_->local.ok()) job_->local = s;
  if (parts_.on_copied) (void)Guarded(parts_.where, [&] { parts_.on_copied(s); });
  parts_.fence->Complete(s);
}

}  // namespace mhckpt::internal
