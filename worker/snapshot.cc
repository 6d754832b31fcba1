#include "worker/snapshot.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "base/checksum.h"
#include "worker/copy.h"
#include "worker/fault_guard.h"

namespace mhckpt::internal {
namespace {

// Copies host box `c` to `dst` and hashes it on the way, a piece of 256 KiB
// at a time while it is in cache (ChecksumChunks's sums, in chunks of
// c.hash_chunk_bytes), into `out`. False if the source faulted (guarded).
//
// A piece is copied with streaming stores and the source is hashed from
// cache: ordinary stores would first read each destination line in, and a
// hash of the destination would read it back, two more passes over memory.
// The source must not change during the copy (the API's contract; a lazy
// save's SaveOptions::protect_host enforces it); if it does, the checksum
// describes bytes the staging copy may not hold, and the restore says
// DataLoss instead of handing back torn bytes that check out.
bool CopyAndHash(const SnapshotCopy& c, std::byte* dst, bool guarded, StagedBox* out) {
  constexpr size_t kPiece = 256 << 10;
  const auto* src = static_cast<const std::byte*>(c.src);
  // One chunk: its sum is the box's, one stream does.
  const bool one_chunk = c.size <= c.hash_chunk_bytes;
  ChecksumStream whole, chunk;
  const std::function<void(const void*, size_t)> hash = [&](const void* data, size_t bytes) {
    chunk.Update(data, bytes);
    if (!one_chunk) whole.Update(data, bytes);
  };
  out->chunks.clear();
  size_t done = 0;
  do {
    const size_t n = std::min(c.hash_chunk_bytes, c.size - done);
    chunk.Reset();
    for (size_t k = 0; k < n; k += kPiece) {
      const size_t at = done + k;
      const size_t m = std::min(kPiece, n - k);
      if (!guarded) {
        CopyUncached(dst + at, src + at, m);
        hash(src + at, m);
      } else if (!GuardedCopyUncached(dst + at, src + at, m, hash)) {
        return false;
      }
    }
    out->chunks.push_back(chunk.Digest());
    done += n;
  } while (done < c.size);
  out->sum = one_chunk ? out->chunks.front() : whole.Digest();
  out->hashed_chunk_bytes = c.hash_chunk_bytes;
  return true;
}

}  // namespace

void SharedCopies::Help() {
  const size_t n = count_.load(std::memory_order_acquire);
  if (n == 0) return;
  for (size_t k; (k = next_.fetch_add(1)) < n;) {
    const bool ok = copy_one_(k);
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) bad_ = std::min(bad_, k);
    if (++done_ == n) cv_.notify_all();
  }
}

namespace {

// The copies `which` of `copies` with CopyAndHash, whole boxes, largest
// first, taken one at a time by up to `threads` threads (and by waiters,
// through options.shared). Returns the index (into `copies`) of a copy
// whose source faulted, or nullopt.
std::optional<size_t> CopyAndHashAll(const std::vector<SnapshotCopy>& copies,
                                     const std::vector<size_t>& which, Snapshot& out,
                                     const SnapshotOptions& options) {
  size_t total = 0;
  for (size_t i : which) total += copies[i].size;
  const size_t n = std::clamp<size_t>(std::min(total / kMinBytesPerCopyThread, which.size()), 1,
                                      static_cast<size_t>(std::max(1, options.threads)));
  std::vector<size_t> order = which;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return copies[a].size > copies[b].size; });
  std::shared_ptr<SharedCopies> work =
      options.shared ? options.shared : std::make_shared<SharedCopies>();
  work->copy_one_ = [&](size_t k) {
    const SnapshotCopy& c = copies[order[k]];
    return CopyAndHash(c, out.buffer.data() + c.offset, options.guarded,
                       &out.arrays[c.array].boxes[c.staged]);
  };
  work->count_.store(order.size(), std::memory_order_release);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) {
    try {
      pool.emplace_back([&work] { work->Help(); });
    } catch (const std::system_error&) {
      break;  // no thread to be had: the others take its boxes
    }
  }
  work->Help();
  for (std::thread& t : pool) t.join();
  size_t bad = SIZE_MAX;
  {
    // Every box taken, by a waiter too, is copied before this returns.
    std::unique_lock<std::mutex> lock(work->mu_);
    work->cv_.wait(lock, [&] { return work->done_ == order.size(); });
    bad = work->bad_;
  }
  if (bad == SIZE_MAX) return std::nullopt;
  return order[bad];
}

// Checks one shard of `a`; returns its byte size or the error.
Result<size_t> CheckShard(const ArrayToSave& a, const Shard& s, int rank) {
  auto where = [&] {
    return fmt::format("array '{}' on rank {}, box {}", a.name, rank, BoxToString(s.box));
  };
  if (s.memory != Memory::kHost && s.memory != Memory::kCuda) {
    return InvalidArgument(
        fmt::format("{}: invalid memory kind {}", where(), static_cast<int>(s.memory)));
  }
  if (std::string why = CheckBoxInShape(s.box, a.shape); !why.empty()) {
    return InvalidArgument(
        fmt::format("{}: box outside shape {}: {}", where(), ShapeToString(a.shape), why));
  }
  auto n = Volume(s.box.count);
  if (!n) return InvalidArgument(fmt::format("{}: box volume overflows", where()));
  if (static_cast<uint64_t>(*n) > kMaxBoxBytes / DTypeSize(a.dtype)) {
    return InvalidArgument(fmt::format("{}: {} elements of {} are more than 2^62 bytes", where(),
                                       *n, DTypeName(a.dtype)));
  }
  size_t bytes = static_cast<size_t>(*n) * DTypeSize(a.dtype);
  if (bytes > 0 && s.data == nullptr)
    return InvalidArgument(fmt::format("{}: data is null", where()));
  if (s.memory == Memory::kCuda && bytes > 0 && !CudaAvailable()) {
    return InvalidArgument(fmt::format("{}: device memory, but no CUDA device is usable", where()));
  }
  // Staging is pinned on a device the caller uses, never on another.
  if (s.memory == Memory::kCuda && bytes > 0) NoteDevice(s.device, s.data);
  return bytes;
}

// Why array `a` cannot be saved at all (its name, dtype or shape), or OK.
// `seen` holds the names checked so far on this rank.
Status CheckArray(const ArrayToSave& a, int rank, std::set<std::string_view>& seen) {
  if (std::string why = CheckArrayName(a.name); !why.empty()) {
    // The name is quoted escaped and cut short: it may be any bytes, of any length.
    return InvalidArgument(
        fmt::format("array '{}' on rank {}: bad name: {}", QuoteForMessage(a.name), rank, why));
  }
  if (!seen.insert(a.name).second) {
    return InvalidArgument(fmt::format("array '{}' on rank {}: duplicate name", a.name, rank));
  }
  if (!IsValidDType(a.dtype)) {
    return InvalidArgument(fmt::format("array '{}' on rank {}: invalid dtype {}", a.name, rank,
                                       static_cast<int>(a.dtype)));
  }
  if (a.shape.size() > kMaxDims) {
    return InvalidArgument(fmt::format("array '{}' on rank {}: {} dimensions, more than {}", a.name,
                                       rank, a.shape.size(), kMaxDims));
  }
  if (!Volume(a.shape)) {
    return InvalidArgument(fmt::format("array '{}' on rank {}: invalid shape {}", a.name, rank,
                                       ShapeToString(a.shape)));
  }
  return OkStatus();
}

// Why this rank's save is too large to describe at all (kMaxArraysPerSave,
// kMaxShardsPerRank), or OK.
Status CheckCounts(std::span<const ArrayToSave> arrays, int rank) {
  if (arrays.size() > kMaxArraysPerSave) {
    return InvalidArgument(fmt::format("rank {}: {} arrays in one save, more than {}", rank,
                                       arrays.size(), kMaxArraysPerSave));
  }
  size_t shards = 0;
  for (const ArrayToSave& a : arrays) shards += a.shards.size();
  if (shards > kMaxShardsPerRank) {
    return InvalidArgument(fmt::format("rank {}: {} shards in one save, more than {}", rank, shards,
                                       kMaxShardsPerRank));
  }
  return OkStatus();
}

// Step 1: describes every array in `out` with its valid boxes, placed back
// to back, and plans their copies. Returns the first error; the arrays and
// boxes after it are still checked and described.
Status PlanCopies(std::span<const ArrayToSave> arrays, int rank, Snapshot* out,
                  std::vector<SnapshotCopy>* copies, size_t* total) {
  Status first_error;
  auto note = [&](Status s) {
    if (first_error.ok() && !s.ok()) first_error = std::move(s);
  };
  std::set<std::string_view> seen;
  out->arrays.clear();
  // Too many to describe: the rank takes part in the plan round with its
  // error and an empty description.
  MHCKPT_RETURN_IF_ERROR(CheckCounts(arrays, rank));
  out->arrays.reserve(arrays.size());
  for (const ArrayToSave& a : arrays) {
    if (Status s = CheckArray(a, rank, seen); !s.ok()) {
      // Described without what failed: a bad name or shape may be of any size.
      out->arrays.push_back(StagedArray{QuoteForMessage(a.name), a.dtype, {}, {}});
      note(std::move(s));
      continue;
    }
    out->arrays.push_back(StagedArray{a.name, a.dtype, a.shape, {}});
    for (const Shard& s : a.shards) {
      Result<size_t> bytes = CheckShard(a, s, rank);
      if (!bytes.ok()) {
        note(bytes.status());
        continue;
      }
      if (*total > kMaxBoxBytes - *bytes) {
        note(InvalidArgument(fmt::format(
            "array '{}' on rank {}, box {}: this rank's boxes add up to more than 2^62 bytes",
            a.name, rank, BoxToString(s.box))));
        continue;
      }
      out->arrays.back().boxes.push_back(StagedBox{s.box, *total, *bytes, 0, 0, {}});
      copies->push_back(SnapshotCopy{s.data, *total, *bytes, s.memory, s.device, s.stream,
                                     out->arrays.size() - 1, s.box});
      copies->back().staged = out->arrays.back().boxes.size() - 1;
      *total += *bytes;
    }
  }
  return first_error;
}

// `s` about copy `c`: its message after the array and the box.
Status AboutBox(const Status& s, const SnapshotCopy& c, const Snapshot& out) {
  return Status(s.code(), fmt::format("array '{}', box {}: {}", out.arrays[c.array].name,
                                      BoxToString(c.box), s.message()));
}

// Step 3: host boxes on several threads, device boxes through CUDA (after
// `mark`'s events, for a lazy save).
Status CopyBoxes(const std::vector<SnapshotCopy>& copies, Snapshot& out,
                 const SnapshotOptions& options, const CallerStreamMark* mark) {
  std::vector<CopyTask> host, device;
  std::vector<size_t> host_index, device_index, hashed;
  for (size_t i = 0; i < copies.size(); ++i) {
    const SnapshotCopy& c = copies[i];
    CopyTask t{out.buffer.data() + c.offset, c.src, c.size, c.device, c.stream};
    if (c.size == 0) continue;
    if (c.memory == Memory::kHost && c.hash_chunk_bytes > 0) {
      hashed.push_back(i);
    } else if (c.memory == Memory::kCuda) {
      device.push_back(t);
      device_index.push_back(i);
    } else {
      host.push_back(t);
      host_index.push_back(i);
    }
  }
  Status s;
  if (!device.empty() && mark == nullptr) s = CopyDeviceToHost(device);
  std::optional<size_t> bad_hashed;
  if (!hashed.empty()) bad_hashed = CopyAndHashAll(copies, hashed, out, options);
  std::optional<size_t> bad_host;
  if (!options.guarded) {
    ParallelCopy(host, options.threads);
  } else if (std::optional<size_t> bad = ParallelGuardedCopy(host, options.threads)) {
    bad_host = host_index[*bad];
  }
  if (bad_hashed || bad_host) {
    const SnapshotCopy& c =
        copies[std::min(bad_hashed.value_or(SIZE_MAX), bad_host.value_or(SIZE_MAX))];
    return InvalidArgument(fmt::format(
        "array '{}', box {}: its memory was freed or made unreadable before the lazy save's "
        "copy of it ended (wait on the save's fence before freeing, donating or deleting a "
        "saved buffer)",
        out.arrays[c.array].name, BoxToString(c.box)));
  }
  // A lazy save's device boxes after its host boxes: the work queued on the
  // caller's streams before Save, which they wait for, runs meanwhile.
  if (!device.empty() && mark != nullptr) {
    std::optional<size_t> failed;
    s = CopyDeviceToHostAfter(device, *mark, &failed);
    if (!s.ok() && failed) s = AboutBox(s, copies[device_index[*failed]], out);
  }
  return s;
}

}  // namespace

Status PrepareSnapshot(std::span<const ArrayToSave> arrays, const SnapshotOptions& options,
                       Snapshot* out, std::vector<SnapshotCopy>* copies) {
  size_t total = 0;
  Status s = PlanCopies(arrays, options.rank, out, copies, &total);
  out->total_bytes = total;
  return s;
}

Status MarkDeviceCopies(std::vector<SnapshotCopy>* copies, const Snapshot& out,
                        const SnapshotOptions& options, CallerStreamMark* mark) {
  std::vector<CopyTask> device;
  std::vector<size_t> device_index;
  for (size_t i = 0; i < copies->size(); ++i) {
    const SnapshotCopy& c = (*copies)[i];
    if (c.memory != Memory::kCuda || c.size == 0) continue;
    device.push_back(CopyTask{nullptr, c.src, c.size, c.device, c.stream});
    device_index.push_back(i);
  }
  if (device.empty()) return OkStatus();
  std::optional<size_t> failed;
  Status s = MarkCallerStreams(device, mark, &failed);
  if (!s.ok()) {
    if (failed) s = AboutBox(s, (*copies)[device_index[*failed]], out);
    return Status(s.code(), fmt::format("rank {}: {}", options.rank, s.message()));
  }
  for (size_t k = 0; k < device.size(); ++k) (*copies)[device_index[k]].device = device[k].device;
  return OkStatus();
}

Status AcquireStaging(const SnapshotOptions& options, StagingPool& pool, Snapshot* out) {
  // 2. Staging memory from the pool (reused between saves; may wait for budget).
  Result<StagingBuffer> buffer = pool.Acquire(out->total_bytes, &out->budget_wait_seconds);
  if (!buffer.ok()) {
    for (StagedArray& a : out->arrays) a.boxes.clear();
    out->total_bytes = 0;
    return Status(buffer.status().code(),
                  fmt::format("rank {}: {}", options.rank, buffer.status().message()));
  }
  out->buffer = std::move(buffer).value();
  return OkStatus();
}

Status CopyIntoSnapshot(const std::vector<SnapshotCopy>& copies, const SnapshotOptions& options,
                        Status error, Snapshot* out, const CallerStreamMark* mark) {
  // 3. Copy.
  Status copied = CopyBoxes(copies, *out, options, mark);
  if (error.ok() && !copied.ok()) {
    error = Status(copied.code(), fmt::format("rank {}: {}", options.rank, copied.message()));
  }
  return error;
}

Status FillSnapshot(const std::vector<SnapshotCopy>& copies, const SnapshotOptions& options,
                    Status error, StagingPool& pool, Snapshot* out, const CallerStreamMark* mark) {
  Status staged = AcquireStaging(options, pool, out);
  if (!staged.ok()) return error.ok() ? staged : error;  // nothing to copy into
  return CopyIntoSnapshot(copies, options, std::move(error), out, mark);
}

Status TakeSnapshot(std::span<const ArrayToSave> arrays, const SnapshotOptions& options,
                    StagingPool& pool, Snapshot* out) {
  // 1. Check every array and shard; size the staging buffer from the valid ones.
  std::vector<SnapshotCopy> copies;
  Status error = PrepareSnapshot(arrays, options, out, &copies);
  return FillSnapshot(copies, options, std::move(error), pool, out);
}

}  // namespace mhckpt::internal
