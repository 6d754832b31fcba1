// Restore of one committed step, run by every rank on its I/O thread:
//
//   1. Rank 0 reads the commit marker and broadcasts it (no marker: the step
//      is not committed, NotFound everywhere).
//   2. Each rank checks its own requests against the marker; one agreement.
//      One allreduce tells every rank which arrays anybody wants, and whether
//      every rank wants all of a replicated array.
//   3. All ranks open the file and, collectively, each wanted dataset. Each
//      rank reads its boxes as hyperslabs (independent transfers), so any
//      sharding on any world size is a plain read. A replicated array that
//      every rank wants whole is read once by rank 0 and broadcast.
//      Where a read covers a whole stored box (the box itself, or a slice of
//      whole rows of it), its checksum is checked.
//   4. Close; one agreement.
//
// Verify (below) is the same walk over every stored box, split over the
// ranks, read in bounded slabs and checked against the marker's checksums.
#include <algorithm>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "base/checksum.h"
#include "coordinator/agree.h"
#include "coordinator/manager_impl.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/posix_file.h"
#include "worker/copy.h"

namespace mhckpt {
namespace {

// Checks this rank's requests against the marker (step 2).
Status CheckRequests(const io::Marker& m, std::span<const ArrayToRestore> arrays,
                     const RestoreOptions& options, int rank) {
  std::set<std::string_view> names;
  for (const ArrayToRestore& a : arrays) {
    if (!names.insert(a.name).second) {
      return InvalidArgument(fmt::format("array '{}' on rank {}: requested twice", a.name, rank));
    }
    const io::MarkerArray* stored = m.Find(a.name);
    if (stored == nullptr) {
      return NotFound(
          fmt::format("array '{}' (requested on rank {}) is not in step {}", a.name, rank, m.step));
    }
    if (a.dtype != stored->dtype) {
      return InvalidArgument(fmt::format("array '{}' on rank {}: requested as {}, stored as {}",
                                         a.name, rank, DTypeName(a.dtype),
                                         DTypeName(stored->dtype)));
    }
    for (const Destination& d : a.shards) {
      auto where = [&] {
        return fmt::format("array '{}' on rank {}, box {}", a.name, rank, BoxToString(d.box));
      };
      if (std::string why = CheckBoxInShape(d.box, stored->shape); !why.empty()) {
        return InvalidArgument(fmt::format("{}: box outside shape {}: {}", where(),
                                           ShapeToString(stored->shape), why));
      }
      if (d.data == nullptr && Volume(d.box.count).value_or(0) > 0) {
        return InvalidArgument(fmt::format("{}: data is null", where()));
      }
      if (d.memory == Memory::kCuda && !CudaAvailable()) {
        return InvalidArgument(
            fmt::format("{}: device memory, but no CUDA device is usable", where()));
      }
    }
  }
  if (options.strict) {
    for (const io::MarkerArray& a : m.arrays) {
      if (!names.count(a.name)) {
        return InvalidArgument(
            fmt::format("strict restore: array '{}' of step {} is not requested "
                        "on rank {}",
                        a.name, m.step, rank));
      }
    }
  }
  return OkStatus();
}

// Where the bytes of one destination land first: the destination itself for
// host memory, a host bounce buffer for device memory (then copied over).
class Landing {
 public:
  Landing(const Destination& d, DType dtype)
      : d_(d), bytes_(static_cast<size_t>(Volume(d.box.count).value_or(0)) * DTypeSize(dtype)) {
    if (d.memory == Memory::kCuda) bounce_.reset(new std::byte[bytes_]);
  }
  [[nodiscard]] void* host() const { return bounce_ ? bounce_.get() : d_.data; }
  [[nodiscard]] size_t bytes() const { return bytes_; }
  /// Moves the bytes to the device, if the destination lives there.
  [[nodiscard]] Status Finish() const {
    if (!bounce_) return OkStatus();
    CopyTask t{d_.data, bounce_.get(), bytes_};
    return CopyHostToDevice({&t, 1});
  }

 private:
  const Destination& d_;
  size_t bytes_;
  std::unique_ptr<std::byte[]> bounce_;
};

// Collective: rank 0 reads the marker of `step`; every rank gets it parsed.
Result<io::Marker> ReadMarkerEverywhere(const Comm& comm, const std::string& root, int64_t step) {
  Status s;
  std::string text;
  if (comm.rank() == 0) {
    Result<std::string> r = io::ReadSmallFile(io::MarkerPath(root, step), io::kMaxMarkerBytes);
    if (r.ok()) {
      text = std::move(r).value();
    } else if (r.status().code() == StatusCode::kNotFound) {
      s = NotFound(fmt::format("step {} is not committed in '{}'", step, root));
    } else {
      s = r.status();
    }
  }
  MHCKPT_RETURN_IF_ERROR(BroadcastStatus(s, 0, comm));
  comm.BroadcastBytes(&text, 0);
  // Every rank parses the same bytes: the outcome is the same everywhere.
  return io::ParseMarker(text, io::MarkerPath(root, step));
}

// DataLoss unless `bytes` at `data` have the checksum the marker recorded.
Status CheckBox(const io::MarkerArray& a, const io::MarkerBox& b, uint64_t actual) {
  if (actual == b.checksum) return OkStatus();
  return DataLoss(fmt::format(
      "array '{}' box {}: checksum mismatch: the marker says {}, the file "
      "holds {}",
      a.name, BoxToString(b.box), ChecksumToString(b.checksum), ChecksumToString(actual)));
}

// Checks every stored box of `a` whose bytes all lie, contiguously, in the
// `bytes` read for `box` at `host`: the box itself, or a slice of whole rows
// of it (row shards, or the slices of replica-parallel saving, read whole). A
// read of part of a stored box cannot be checked against its checksum.
Status CheckStoredBoxes(const io::MarkerArray& a, const Box& box, const std::byte* host,
                        size_t bytes) {
  const size_t dims = box.count.size();
  for (const io::MarkerBox& b : a.boxes) {
    if (b.box == box) {
      MHCKPT_RETURN_IF_ERROR(CheckBox(a, b, Checksum(host, bytes)));
      continue;
    }
    if (dims == 0 || box.count[0] <= 0 || b.box.count.size() != dims ||
        !std::equal(box.start.begin() + 1, box.start.end(), b.box.start.begin() + 1) ||
        !std::equal(box.count.begin() + 1, box.count.end(), b.box.count.begin() + 1) ||
        b.box.start[0] < box.start[0] ||
        b.box.start[0] + b.box.count[0] > box.start[0] + box.count[0]) {
      continue;
    }
    const size_t row_bytes = bytes / static_cast<size_t>(box.count[0]);
    MHCKPT_RETURN_IF_ERROR(
        CheckBox(a, b,
                 Checksum(host + static_cast<size_t>(b.box.start[0] - box.start[0]) * row_bytes,
                          static_cast<size_t>(b.box.count[0]) * row_bytes)));
  }
  return OkStatus();
}

}  // namespace

Status CheckpointManager::Impl::RunRestore(int64_t step, std::span<const ArrayToRestore> arrays,
                                           const RestoreOptions& options) {
  const int rank = comm_.rank();

  // 1. The marker, from rank 0.
  MHCKPT_ASSIGN_OR_RETURN(io::Marker m, ReadMarkerEverywhere(comm_, root_, step));

  // 2. Check the requests; learn what everyone wants.
  MHCKPT_RETURN_IF_ERROR(AgreeAll(CheckRequests(m, arrays, options, rank), comm_));
  std::map<std::string_view, const ArrayToRestore*> mine;
  for (const ArrayToRestore& a : arrays) mine[a.name] = &a;
  // Per array: [wanted by anyone, wanted by someone other than whole-at-once].
  std::vector<int> flags(2 * m.arrays.size(), 0);
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    auto it = mine.find(m.arrays[i].name);
    bool whole = it != mine.end() && it->second->shards.size() == 1 &&
                 it->second->shards[0].box == FullBox(m.arrays[i].shape);
    flags[2 * i] = it != mine.end() ? 1 : 0;
    flags[2 * i + 1] = whole ? 0 : 1;
  }
  comm_.AllreduceMax(&flags);

  // 3. Read.
  Status local;
  Result<io::H5File> file =
      io::H5File::OpenReadOnly(io::DataPath(root_, step), comm_.get(), Transfer::kIndependent);
  if (!file.ok()) {
    local = DataLoss(fmt::format("step {}: {}", step, file.status().message()));
  } else {
    for (size_t i = 0; i < m.arrays.size(); ++i) {
      if (!flags[2 * i]) continue;
      const io::MarkerArray& a = m.arrays[i];
      Result<io::Dataset> ds = file->OpenDataset(a.name, a.dtype, a.shape);
      if (!ds.ok()) {
        if (local.ok()) local = ds.status();
        continue;
      }
      auto it = mine.find(a.name);
      if (a.replicated && !flags[2 * i + 1]) {
        // Why a broadcast: every rank wants the whole array; one read serves all.
        // (Seam: device destinations could be broadcast with NCCL instead.)
        Landing land(it->second->shards[0], a.dtype);
        if (rank == 0 && local.ok()) local = ds->Read(it->second->shards[0].box, land.host());
        if (rank == 0 && local.ok()) {
          local = CheckStoredBoxes(a, it->second->shards[0].box,
                                   static_cast<const std::byte*>(land.host()), land.bytes());
        }
        comm_.BroadcastBuffer(land.host(), land.bytes(), 0);
        if (local.ok()) local = land.Finish();
        continue;
      }
      if (it == mine.end() || !local.ok()) continue;
      for (const Destination& d : it->second->shards) {
        if (Volume(d.box.count).value_or(0) == 0) continue;
        Landing land(d, a.dtype);
        local = ds->Read(d.box, land.host());
        if (local.ok()) {
          local =
              CheckStoredBoxes(a, d.box, static_cast<const std::byte*>(land.host()), land.bytes());
        }
        if (local.ok()) local = land.Finish();
        if (!local.ok()) break;
      }
    }
    Status closed = file->Close();
    if (local.ok()) local = closed;
  }
  if (!local.ok()) local = Status(local.code(), fmt::format("rank {}: {}", rank, local.message()));
  // 4. Agree.
  return AgreeAll(local, comm_);
}

}  // namespace mhckpt

namespace mhckpt {

Status CheckpointManager::Impl::RunVerify(int64_t step, uint64_t* bytes_checked) {
  const int rank = comm_.rank(), size = comm_.size();
  MHCKPT_ASSIGN_OR_RETURN(io::Marker m, ReadMarkerEverywhere(comm_, root_, step));
  Status local;
  uint64_t checked = 0;
  Result<io::H5File> file =
      io::H5File::OpenReadOnly(io::DataPath(root_, step), comm_.get(), Transfer::kIndependent);
  if (!file.ok()) {
    local = DataLoss(fmt::format("step {}: {}", step, file.status().message()));
  } else {
    size_t turn = 0;  // boxes are dealt to ranks in turn
    for (const io::MarkerArray& a : m.arrays) {
      Result<io::Dataset> ds = file->OpenDataset(a.name, a.dtype, a.shape);  // collective
      if (!ds.ok()) {
        if (local.ok()) local = ds.status();
        continue;
      }
      for (const io::MarkerBox& b : a.boxes) {
        if (turn++ % static_cast<size_t>(size) != static_cast<size_t>(rank) || !local.ok())
          continue;
        // Read in slabs of whole leading-dimension rows, at most ~64 MiB each:
        // a huge box never becomes a huge allocation.
        const size_t row_bytes = a.shape.empty()
                                     ? DTypeSize(a.dtype)
                                     : static_cast<size_t>(*Volume(std::vector<int64_t>(
                                           b.box.count.begin() + 1, b.box.count.end()))) *
                                           DTypeSize(a.dtype);
        const int64_t rows = a.shape.empty() ? 1 : b.box.count[0];
        const int64_t rows_per_slab = std::max<int64_t>(
            1, static_cast<int64_t>((size_t{64} << 20) / std::max<size_t>(row_bytes, 1)));
        std::vector<std::byte> slab(static_cast<size_t>(std::min(rows, rows_per_slab)) * row_bytes);
        ChecksumStream sum;
        for (int64_t r0 = 0; r0 < rows && local.ok(); r0 += rows_per_slab) {
          Box part = b.box;
          if (!a.shape.empty()) {
            part.start[0] = b.box.start[0] + r0;
            part.count[0] = std::min(rows_per_slab, rows - r0);
          }
          size_t n = a.shape.empty() ? row_bytes : static_cast<size_t>(part.count[0]) * row_bytes;
          if (n > 0) local = ds->Read(part, slab.data());
          sum.Update(slab.data(), n);
          checked += n;
        }
        if (local.ok()) local = CheckBox(a, b, sum.Digest());
      }
    }
    Status closed = file->Close();
    if (local.ok()) local = closed;
  }
  if (!local.ok()) local = Status(local.code(), fmt::format("rank {}: {}", rank, local.message()));
  Status s = AgreeAll(local, comm_);
  if (bytes_checked) {
    unsigned long long mine = checked, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm_.get());
    *bytes_checked = all;
  }
  return s;
}

}  // namespace mhckpt
