// The local commit of a save (coordinator/save.cc, between steps 2 and 3):
// SaveRun's phase on the I/O thread, with its communicator, over the local
// tier's save (coordinator/local_tier.h):
//   1. LocalTier::Write (the local tier's steps 1-3): every rank writes its
//      file of the step from its staged boxes and exchanges copies or parity,
//      taking the checksums of the boxes it wrote.
//   2. One gather: every rank's outcome and checksums to rank 0, which fills
//      the marker (format 2: every chunk listed; no subfiles) and broadcasts
//      it; every rank agrees that it could read it.
//   3. LocalTier::Commit (the local tier's steps 4-5: every node puts the
//      marker; retention), or on any failure LocalTier::Abandon.
// Then, for a save that also goes to the shared root, ReadFromLocalCopy maps
// this rank's file of the step (or takes the landing file's kept mapping, if
// the copy landed there): the shared root's write reads the boxes from it,
// and the staging buffer goes back at once.
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/committed_step.h"
#include "coordinator/save_run.h"
#include "coordinator/shared_commit.h"
#include "io/layout.h"
#include "io/step_index.h"

namespace mhckpt::internal {

Status ManagerImpl::SaveRun::SaveLocal(const Comm& comm) {
  const auto staged = StagedByName(job_.snapshot);
  std::vector<BoxSum> sums;
  Status mine = impl_.local_->Write(
      comm, plan_,
      [&](size_t ai, size_t bi) {
        auto it = staged.find(plan_.arrays[ai].name);
        return FindStaged(job_.snapshot, it == staged.end() ? nullptr : it->second,
                          plan_.arrays[ai].boxes[bi].box);
      },
      &sums,
      [&](size_t ai, size_t bi) -> const StagedBox* {
        auto it = staged.find(plan_.arrays[ai].name);
        if (it == staged.end()) return nullptr;
        for (const StagedBox& b : it->second->boxes) {
          if (b.box == plan_.arrays[ai].boxes[bi].box) return &b;
        }
        return nullptr;
      });
  std::vector<std::string> reports = comm.GatherBytes(EncodeReport(mine, sums), 0);
  local_sums_ = std::move(sums);  // the shared root's commit reuses them
  io::Marker marker;
  std::string text;
  Status s;
  if (rank_ == 0) {
    s = Guarded("rank 0: local commit", [&] {
      marker = plan_;
      // A node's marker lists every chunk (format 2): its steps are read
      // back by the node's ranks and their partners, not at scale.
      if (marker.format_version >= 3) io::PlanChunks(&marker, marker.chunk_bytes, 2);
      marker.files = 0;  // nor subfiles: a reused plan keeps the last save's
      MHCKPT_RETURN_IF_ERROR(FillChecksums(reports, &marker));
      marker.created_unix_ms = NowUnixMs();
      if (marker.preemption) {
        marker.preemption->saved_after_ms =
            marker.created_unix_ms - marker.preemption->notice_unix_ms;
      }
      text = io::MarkerToJson(marker);
      return OkStatus();
    });
  }
  s = BroadcastStatus(s, 0, comm);
  if (s.ok()) {
    comm.BroadcastBytes(&text, 0);
    Status parsed;
    if (rank_ != 0) {
      Result<io::Marker> m = io::ParseMarker(text, "rank 0's local marker");
      if (m.ok()) {
        marker = std::move(m).value();
      } else {
        parsed = Internal(fmt::format("rank {}: {}", rank_, m.status().message()));
      }
    }
    s = AgreeAll(parsed, comm);
  }
  if (!s.ok()) {
    impl_.local_->Abandon(comm, job_.step);
    return s;
  }
  return impl_.local_->Commit(comm, marker, text);
}

void ManagerImpl::SaveRun::ReadFromLocalCopy() {
  const WriterFiles files(plan_);
  const std::byte* data = nullptr;
  uint64_t size = 0;
  // The landing file's mapping, if the copy landed there: not mapped again.
  local_kept_ = impl_.local_->KeptMapping(job_.step, rank_, files.BytesOf(rank_));
  if (local_kept_ != nullptr) {
    data = local_kept_->data;
    size = local_kept_->size;
  } else {
    Result<io::MappedFile> f =
        io::MappedFile::OpenForReading(impl_.local_->FilePath(job_.step, rank_));
    if (!f.ok()) return;
    local_copy_ = std::move(f).value();
    data = local_copy_.data();
    size = local_copy_.size();
  }
  from_local_ = [this, data, size, offsets = files.offset](size_t ai, size_t bi) {
    const io::MarkerArray& a = plan_.arrays[ai];
    const uint64_t at = offsets[ai][bi], n = BoxBytes(a.boxes[bi].box, a.dtype);
    if (at + n > size) return std::span<const std::byte>();
    return std::span<const std::byte>(data + at, n);
  };
  job_.snapshot.buffer = StagingBuffer();
}

}  // namespace mhckpt::internal
