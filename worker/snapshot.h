// The rank-local side of a save: check what the caller handed over and copy
// every box into host memory that mhckpt owns. After TakeSnapshot returns,
// nothing reads caller memory again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "worker/array.h"
#include "worker/copy.h"
#include "worker/staging_pool.h"

namespace mhckpt::internal {

/// A copied box: its place in the global array and its bytes in the staging
/// buffer of the snapshot.
struct StagedBox {
  Box box;
  size_t offset = 0;  ///< into Snapshot::bytes
  size_t size = 0;    ///< bytes
  /// Set by a copy that hashed the box on the way (SnapshotCopy::
  /// hash_chunk_bytes): the chunk size, the box's checksum and its chunks'
  /// (as ChecksumChunks gives them). 0: not hashed.
  size_t hashed_chunk_bytes = 0;
  uint64_t sum = 0;
  std::vector<uint64_t> chunks;
};

/// An array as this rank described it, with its copied boxes.
struct StagedArray {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<StagedBox> boxes;
};

/// Everything a rank contributes to one save.
struct Snapshot {
  std::vector<StagedArray> arrays;  ///< in the caller's order
  StagingBuffer buffer;             ///< every box, back to back
  size_t total_bytes = 0;
  double budget_wait_seconds = 0;  ///< waiting for staging memory

  [[nodiscard]] const std::byte* data(const StagedBox& b) const { return buffer.data() + b.offset; }
};

/// A lazy save's hashed host copies (SnapshotCopy::hash_chunk_bytes), box by
/// box, largest first, shared with any thread that waits for them: Help,
/// called by a caller waiting on the save's fence, takes the boxes no thread
/// has taken yet and copies them at that thread's priority, instead of
/// waiting for the copier (at the lowest) to get a core. The copy returns
/// once every box taken by anyone is copied.
class SharedCopies {
 public:
  /// Copies boxes until none is left to take; returns at once if the copy
  /// has not started or every box is taken.
  void Help();

  // The copy's own (worker/snapshot.cc).
  std::function<bool(size_t)> copy_one_;  // set before count_; false: a fault
  std::atomic<size_t> count_{0};
  std::atomic<size_t> next_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  size_t done_ = 0;
  size_t bad_ = SIZE_MAX;  // the first box whose source faulted
};

struct SnapshotOptions {
  int rank = 0;     ///< for error messages
  int threads = 1;  ///< for host copies
  /// Host copies with GuardedCopy (worker/fault_guard.h): a lazy save's
  /// source freed under the copy is an error naming the array, not a crash.
  bool guarded = false;
  /// A lazy save's: its hashed host copies are shared with waiters (Help).
  std::shared_ptr<SharedCopies> shared;
};

/// One copy into the staging buffer, planned before the buffer exists.
struct SnapshotCopy {
  const void* src = nullptr;
  size_t offset = 0;  ///< into the staging buffer
  size_t size = 0;
  Memory memory = Memory::kHost;
  int device = -1;         ///< device memory: Shard::device
  void* stream = nullptr;  ///< device memory: Shard::stream
  size_t array = 0;        ///< index into Snapshot::arrays, for messages
  Box box;
  size_t staged = 0;  ///< index into Snapshot::arrays[array].boxes
  /// A host box: > 0 hashes it on the way (one pass over the bytes: each
  /// piece hashed while in cache), in chunks of this many bytes, into its
  /// StagedBox.
  size_t hash_chunk_bytes = 0;
};

/// Checks `arrays` locally (names, dtypes, boxes inside shapes, null
/// pointers, duplicates on this rank), takes one buffer from `pool` (waiting
/// while the pool's budget is in use), and copies every valid box into it:
/// host boxes with several threads, device boxes with cudaMemcpyAsync. On
/// return no caller buffer is needed any more. On a bad input it returns the
/// error, naming the array, the rank and the box; the snapshot then still
/// describes every array (without the bad boxes; an array with a bad name,
/// dtype or shape by its quoted name alone), so the rank can take part in the
/// next collective round carrying its error. Limits: kMaxArraysPerSave,
/// kMaxShardsPerRank, kMaxBoxBytes (worker/array.h), kMaxDims and the name
/// limits (base/types.h).
Status TakeSnapshot(std::span<const ArrayToSave> arrays, const SnapshotOptions& options,
                    StagingPool& pool, Snapshot* out);

/// TakeSnapshot in two halves, for a lazy save: PrepareSnapshot checks and
/// describes `arrays` in `out` and plans `copies` (it reads no array bytes);
/// FillSnapshot takes the staging buffer and copies. `error` is what
/// PrepareSnapshot returned; FillSnapshot returns it or its own.
/// A lazy save's device boxes are ordered between the halves, on the
/// caller's thread when Save is called: MarkDeviceCopies records an event on
/// each caller stream of `copies` (CallerStreamMark, worker/copy.h) and sets
/// each device copy's device; FillSnapshot given `mark` then copies device
/// boxes after those events, on mhckpt's streams, and returns once they have
/// completed. A CUDA error names the array, the rank and the box.
Status PrepareSnapshot(std::span<const ArrayToSave> arrays, const SnapshotOptions& options,
                       Snapshot* out, std::vector<SnapshotCopy>* copies);
Status MarkDeviceCopies(std::vector<SnapshotCopy>* copies, const Snapshot& out,
                        const SnapshotOptions& options, CallerStreamMark* mark);
Status FillSnapshot(const std::vector<SnapshotCopy>& copies, const SnapshotOptions& options,
                    Status error, StagingPool& pool, Snapshot* out,
                    const CallerStreamMark* mark = nullptr);

/// FillSnapshot in its two steps, for a lazy save, whose staging is taken on
/// the caller's thread when Save is called (saves take the pool's budget in
/// the order they were made, so a later save can never take the memory an
/// earlier lazy copy is waiting for) and whose copy runs later on the
/// copier's thread. AcquireStaging returns the pool's IoError, naming the
/// rank (then `out` describes no boxes and nothing may be copied);
/// CopyIntoSnapshot returns `error` or the copy's own.
Status AcquireStaging(const SnapshotOptions& options, StagingPool& pool, Snapshot* out);
Status CopyIntoSnapshot(const std::vector<SnapshotCopy>& copies, const SnapshotOptions& options,
                        Status error, Snapshot* out, const CallerStreamMark* mark = nullptr);

}  // namespace mhckpt::internal
