// The direct engine's writer of one data file (io/direct_engine.h): HDF5
// lays out a step exactly as the HDF5 engine does (io/h5_engine.h:
// ROOT/step_N/data.h5, one global dataset per array) and keeps every byte of
// metadata; the array bytes are pwritten by each rank at its datasets' file
// offsets (io/raw_writer.h), with O_DIRECT where the file system accepts it.
// The file is plain HDF5: h5py, h5dump and the HDF5 engine's reader read it.
//
// Rank 0 alone lays the file out (io/dataset_layout.h: LayOutArrays,
// replayed when the arrays are the last save's), through HDF5's POSIX
// driver, and broadcasts the datasets' offsets; the other ranks never call
// HDF5 while saving, and nobody pays for MPI-IO and collective metadata per
// dataset (10,000 small arrays: docs/PERFORMANCE.md, "Many small arrays").
//
// Why HDF5 never writes stale bytes over the pwritten ones: a dataset
// created with H5D_FILL_TIME_NEVER is never written by HDF5 unless through
// H5Dwrite, which this writer never calls; its metadata lives at other
// addresses; and HDF5 keeps no raw-data cache for datasets it neither read
// nor wrote. Closing the file writes metadata only and may lengthen the file
// to HDF5's end of allocation, which lies past every dataset; a page shared
// by metadata and array bytes is written through the page cache by both
// (io/raw_writer.h writes only whole pages of array bytes directly). So the
// order is: rank 0 creates the datasets and closes the file (metadata, no
// sync), everyone pwrites, then one fsync per rank of the file, which makes
// both durable (fsync covers every descriptor of a file).
// tests/direct_engine_test.cc checks it byte for byte through HDF5, h5py and
// h5dump.
//
// The subfile writer (io/subfile_writer.h) writes its boxes the same way,
// through BoxWriteQueue.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "io/box_runs.h"
#include "io/dataset_layout.h"
#include "io/raw_writer.h"
#include "io/storage.h"

namespace mhckpt::io {

/// One rank's pwrites into one file: the runs of each box (BoxRuns) wait
/// here until they make a chunk, so that many small arrays are one job for
/// the pool's threads, not one each. A failure to open is this rank's
/// alone: reported by opened() and Finish, while the rank still takes part
/// in every collective call.
class BoxWriteQueue {
 public:
  explicit BoxWriteQueue(RawWriterPool& pool) : pool_(pool) {}
  ~BoxWriteQueue();  ///< the error path: no thread may still write from a caller's buffer
  BoxWriteQueue(const BoxWriteQueue&) = delete;
  BoxWriteQueue& operator=(const BoxWriteQueue&) = delete;

  void Open(const std::string& path, bool direct) { opened_ = raw_.Open(path, direct); }
  [[nodiscard]] const Status& opened() const { return opened_; }
  /// Queues the bytes at `data` of `box` of the array placed at `place`.
  void Add(const Placement& place, const Box& box, const void* data);
  /// Waits for every queued write; the first error (or the open's).
  Status Finish();
  /// Finish, then fsync and close the file.
  Status SyncAndClose();

 private:
  void SubmitPending();

  RawWriterPool& pool_;
  RawFile raw_;
  Status opened_;                // of raw_
  std::vector<RawRun> pending_;  // added, not yet given to the threads
  size_t pending_bytes_ = 0;
};

/// What the direct writer is made with: the engine's parts, which outlive it.
struct DirectWriterOptions {
  RawWriterPool* pool = nullptr;       ///< the engine's writer threads
  bool direct = false;                 ///< O_DIRECT where the file system accepts it
  LayoutSkeleton* skeleton = nullptr;  ///< rank 0's last layout of data.h5
};

/// Collective over `comm`: rank 0 creates ROOT/step_N/data.h5, the others
/// open it for their pwrites once it exists. IoError on every rank if rank 0
/// could not create it.
Result<std::unique_ptr<StepWriter>> CreateDirectStepWriter(const std::string& root, int64_t step,
                                                           const Comm& comm,
                                                           const DirectWriterOptions& options);

}  // namespace mhckpt::io
