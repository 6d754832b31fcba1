// Restore of one committed step, run by every rank on its I/O thread:
//
//   1. Rank 0 reads the commit marker and broadcasts it (no marker: the step
//      is not committed, NotFound everywhere).
//   2. Each rank checks its own requests against the marker; one agreement.
//      One allreduce tells every rank which arrays anybody wants, and whether
//      every rank wants all of a replicated array.
//   3. All ranks open the file and agree that they could (the opens of the
//      datasets that follow are collective), then, collectively, each wanted
//      dataset; a rank that fails to open one still takes part in the
//      array's broadcast, carrying its error. Each
//      rank reads its boxes as hyperslabs (independent transfers), so any
//      sharding on any world size is a plain read. A replicated array that
//      every rank wants whole is read once by rank 0 and broadcast.
//      Where a read covers a whole stored box (the box itself, or a slice of
//      whole rows of it), its checksum is checked.
//   4. Close; one agreement.
#include <memory>
#include <set>

#include <fmt/format.h>

#include "base/checksum.h"
#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/committed_step.h"
#include "coordinator/manager_impl.h"
#include "coordinator/plan.h"
#include "io/marker.h"
#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

// Checks this rank's requests against the marker (step 2).
Status CheckRequests(const io::Marker& m, std::span<const ArrayToRestore> arrays,
                     const RestoreOptions& options, int rank) {
  std::set<std::string_view> names;
  for (const ArrayToRestore& a : arrays) {
    // Names not in the marker are quoted escaped and cut short: they may be
    // any bytes, of any length.
    if (!names.insert(a.name).second) {
      return InvalidArgument(
          fmt::format("array '{}' on rank {}: requested twice", QuoteForMessage(a.name), rank));
    }
    const io::MarkerArray* stored = m.Find(a.name);
    if (stored == nullptr) {
      return NotFound(fmt::format("array '{}' (requested on rank {}) is not in step {}",
                                  QuoteForMessage(a.name), rank, m.step));
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
      if (d.memory != Memory::kHost && d.memory != Memory::kCuda) {
        return InvalidArgument(
            fmt::format("{}: invalid memory kind {}", where(), static_cast<int>(d.memory)));
      }
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

// Checks every stored box of `a` whose bytes all lie, contiguously, in the
// `bytes` read for `box` at `host`: the box itself, or a run of whole rows of
// it (row shards, or the slices of replica-parallel saving, read whole). A
// read of part of a stored box cannot be checked against its checksum.
Status CheckStoredBoxes(const io::MarkerArray& a, const Box& box, const std::byte* host,
                        size_t bytes) {
  for (const io::MarkerBox& b : a.boxes) {
    if (b.box == box) {
      MHCKPT_RETURN_IF_ERROR(CheckChecksum(a, b, Checksum(host, bytes)));
    } else if (auto run = RowRunBytes(box, b.box, bytes)) {
      MHCKPT_RETURN_IF_ERROR(CheckChecksum(a, b, Checksum(host + run->first, run->second)));
    }
  }
  return OkStatus();
}

// Step 3 for an array every rank wants whole: rank 0 reads it once and
// broadcasts it. `local` is this rank's error so far.
Status ReadAndBroadcast(io::StepReader& reader, size_t handle, const io::MarkerArray& a,
                        const Destination& whole, const Comm& comm, Status local) {
  // (Seam: device destinations could be broadcast with NCCL instead.)
  Landing land(whole, a.dtype);
  if (comm.rank() == 0 && local.ok()) {
    local = Guarded("restore", [&] {  // the rank is named with every local error
      MHCKPT_RETURN_IF_ERROR(reader.Read(handle, whole.box, land.host()));
      return CheckStoredBoxes(a, whole.box, static_cast<const std::byte*>(land.host()),
                              land.bytes());
    });
  }
  comm.BroadcastBuffer(land.host(), land.bytes(), 0);
  if (local.ok()) local = land.Finish();
  return local;
}

// Step 3 for the boxes this rank asked for of array `a`.
Status ReadShards(io::StepReader& reader, size_t handle, const io::MarkerArray& a,
                  const ArrayToRestore& request) {
  for (const Destination& d : request.shards) {
    if (Volume(d.box.count).value_or(0) == 0) continue;
    Landing land(d, a.dtype);
    MHCKPT_RETURN_IF_ERROR(reader.Read(handle, d.box, land.host()));
    MHCKPT_RETURN_IF_ERROR(
        CheckStoredBoxes(a, d.box, static_cast<const std::byte*>(land.host()), land.bytes()));
    MHCKPT_RETURN_IF_ERROR(land.Finish());
  }
  return OkStatus();
}

}  // namespace

Status ManagerImpl::RunRestore(int64_t step, std::span<const ArrayToRestore> arrays,
                               const RestoreOptions& options) {
  const int rank = comm_.rank();

  // 1. The marker, from rank 0.
  MHCKPT_ASSIGN_OR_RETURN(io::Marker m, ReadMarkerEverywhere(comm_, root_, step));

  // 2. Check the requests; learn what everyone wants.
  const std::string where = fmt::format("rank {}: restore of step {}", rank, step);
  MHCKPT_RETURN_IF_ERROR(
      AgreeAll(Guarded(where, [&] { return CheckRequests(m, arrays, options, rank); }), comm_));
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
  Result<std::unique_ptr<io::StepReader>> reader = engine_->Open(root_, step, comm_.get());
  if (!reader.ok()) {
    local = DataLoss(fmt::format("rank {}: step {}: {}", rank, step, reader.status().message()));
  }
  // Why an agreement: the dataset opens below are collective; a rank that
  // could not open the file must not leave the others alone in them.
  MHCKPT_RETURN_IF_ERROR(AgreeAll(local, comm_));
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (!flags[2 * i]) continue;
    const io::MarkerArray& a = m.arrays[i];
    Result<size_t> handle = (*reader)->OpenArray(StoredSpec(a));
    if (!handle.ok() && local.ok()) local = handle.status();
    auto it = mine.find(a.name);
    if (a.replicated && !flags[2 * i + 1]) {
      // Why a broadcast: every rank wants the whole array; one read serves
      // all. Every rank takes part, even one that failed to open it.
      local = ReadAndBroadcast(**reader, handle.ok() ? *handle : 0, a, it->second->shards[0], comm_,
                               local);
    } else if (it != mine.end() && local.ok()) {
      // (The rank is named below, with every local error.)
      local = Guarded(fmt::format("restore of step {}", step),
                      [&] { return ReadShards(**reader, *handle, a, *it->second); });
    }
  }
  Status closed = (*reader)->Close();
  if (local.ok()) local = closed;
  if (!local.ok()) local = Status(local.code(), fmt::format("rank {}: {}", rank, local.message()));
  // 4. Agree.
  return AgreeAll(local, comm_);
}

}  // namespace mhckpt::internal
