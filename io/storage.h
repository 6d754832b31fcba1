// The data seam: how the coordinator writes and reads the arrays of one
// step, whatever engine holds them (ADIOS2's word for a storage backend).
// Two engines implement these three classes (Engine, StepWriter,
// StepReader) and MakeEngine chooses between them: parallel HDF5
// (io/h5_engine.h, one global dataset per array, written as hyperslabs) and
// the direct engine (io/direct_engine.h: HDF5 lays the same file out, the
// array bytes are pwritten at the datasets' offsets). A further engine (an
// object store, say) implements the same three. Nothing above io/ includes
// an engine's own header.
//
// A step as an engine sees it: a set of named arrays (name, dtype, global
// shape), each written and read as boxes of row-major bytes. The commit
// marker, the steps of a root and their listing, the root's lock, and
// retirement are not the engine's: they are the root store's (the other seam
// of io/, io/root_store.h), which creates a step before the engine writes
// into it and commits it after.
//
// Every call happens on the I/O thread. Calls marked collective are made by
// every rank of the communicator the step was opened on, in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/comm.h"
#include "base/status.h"
#include "base/types.h"
#include "io/marker.h"

namespace mhckpt::io {

using internal::Comm;  // base/comm.h

/// How ranks move array bytes: each rank on its own, or in collective rounds
/// in which the engine may combine them (MPI-IO two-phase I/O). An engine
/// without collective rounds treats both alike.
enum class Transfer : uint8_t { kIndependent, kCollective };

struct StorageOptions {
  Transfer transfer = Transfer::kIndependent;  ///< for writes; reads are independent
  /// Independent writes only: HDF5 lays out the step and keeps its metadata,
  /// and the array bytes are pwritten at the datasets' offsets by
  /// `writer_threads` threads (io/direct_engine.h). False: HDF5 writes
  /// hyperslabs (io/h5_engine.h), as it always does for kCollective.
  bool pwrite = true;
  /// With `pwrite`: O_DIRECT where the file system accepts it.
  bool direct = true;
  int writer_threads = 2;  ///< with `pwrite`; at least 1
  /// With `pwrite` (the direct engine): 0, one data file for every rank;
  /// k > 0, one subfile per k consecutive ranks; kFilePerNode, one per node
  /// (ranks sharing memory). See io/subfile_writer.h.
  int ranks_per_file = 0;
};

inline constexpr int kFilePerNode = -1;

/// A stored box of an array, and the rank that writes it.
struct BoxSpec {
  Box box;
  int writer = 0;
  bool operator==(const BoxSpec&) const = default;
};

/// One array of a step, as stored.
struct ArraySpec {
  std::string name;  ///< "params/layer0/w"
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  ///< global
  /// For reading: where the array's bytes start in the step's data file, as
  /// the commit marker records it (StepWriter::FileOffset), or -1 if unknown.
  int64_t offset = -1;
  /// For writing: the one rank that writes all of the array's bytes, or -1
  /// (several ranks, or none). A layout hint: the direct engine places each
  /// rank's arrays side by side, so that its small arrays make long runs in
  /// the file (io/dataset_layout.h).
  int writer = -1;
  /// For writing into subfiles (StorageOptions::ranks_per_file): the
  /// array's stored boxes, each to be written whole by its writer.
  std::vector<BoxSpec> boxes;
};

/// How a step is opened for reading.
struct ReadOptions {
  /// Read every array's bytes with pread at the offset its ArraySpec gives,
  /// from the data file opened once, read-only (io/pread_reader.h), instead
  /// of through the engine's per-array opens. Every array opened must have
  /// an offset, or no elements.
  bool by_offset = false;
  /// With `by_offset`: OpenArray still checks, through the engine, that the
  /// array is stored with its dtype, shape and offset (verify). Then
  /// OpenArray is collective; without it, it is local and touches nothing.
  bool check_metadata = false;
  /// With `by_offset`: fault in the pages of each batch's destinations on a
  /// second thread, ahead of the reads into them (io/pread_reader.h).
  bool prefault = false;
  /// With `by_offset`: read long runs with O_DIRECT straight into
  /// destinations that line up with them (io/pread_reader.h).
  bool direct = false;
  /// With `by_offset`: the step's bytes are in this many subfiles
  /// (Marker::files), read through StepReader::OpenBox; 0, in its one data
  /// file.
  int files = 0;
};

/// One read of a batch: `box` of the opened array `array` into the row-major
/// buffer `data`.
struct ReadRequest {
  size_t array = 0;
  Box box;
  void* data = nullptr;
  /// If set, called once every byte of this request is in `data`, on the
  /// thread that read its last byte, while the batch's other reads go on
  /// (several may run at once, each for its own request): checks of the
  /// bytes read overlap the reads. Its error fails the batch (see ReadMany).
  std::function<Status()> on_read = nullptr;
};

/// Writes the arrays of one step. Closing without Flush (destruction) makes
/// nothing durable: the error path.
class StepWriter {
 public:
  virtual ~StepWriter() = default;

  /// Collective. Creates the step's arrays, allocated and not filled; array
  /// `i` of Write and WriteNothing is `arrays[i]`. Stops at the first
  /// failure, which every rank meets alike.
  virtual Status CreateArrays(std::span<const ArraySpec> arrays) = 0;
  /// After CreateArrays: where array `array`'s bytes start in the step's
  /// data file, stored contiguously and row-major (recorded in the commit
  /// marker for readers that read at offsets), or -1 if the engine stores
  /// them otherwise or the array has no bytes.
  [[nodiscard]] virtual int64_t FileOffset(size_t array) const = 0;
  /// After CreateArrays, with subfiles (Files() > 0): where box `box` of
  /// array `array` (ArraySpec::boxes) lies, for a box this rank writes.
  [[nodiscard]] virtual std::optional<BoxPlace> Place(size_t /*array*/, size_t /*box*/) const {
    return std::nullopt;
  }
  /// The step's subfiles (Marker::files), or 0: one data file.
  [[nodiscard]] virtual int Files() const { return 0; }
  /// Rank 0 (with subfiles, every rank: each group's first rank reserves
  /// its subfile), after CreateArrays: reserves exactly the storage the arrays'
  /// data takes, so that a full file system fails here, before any write or
  /// flush in which one rank's error could strand the others. Nothing is to
  /// be given back later. IoError.
  virtual Status Reserve() = 0;
  /// Writes `box` of array `array` from the row-major bytes at `data`, which
  /// must stay valid until FinishWrites returns (an engine may still be
  /// writing them). With Transfer::kCollective every rank makes the same
  /// number of Write and WriteNothing calls for each array, array after
  /// array. IoError.
  virtual Status Write(size_t array, const Box& box, const void* data) = 0;
  /// Takes part in a collective round of `array` with nothing to write.
  virtual Status WriteNothing(size_t array) = 0;
  /// After the last Write: waits until no write reads the callers' buffers
  /// any more; the first error of the writes since the last call. IoError.
  virtual Status FinishWrites() = 0;
  /// Collective. Makes every byte written durable, then closes the step.
  virtual Status Flush() = 0;
};

/// Reads the arrays of one committed step. Reads are independent: each rank
/// reads its own boxes.
class StepReader {
 public:
  virtual ~StepReader() = default;

  /// Collective. Opens array `spec` and checks that it is stored as `spec`
  /// describes it. Returns the handle that Read takes. DataLoss, naming the
  /// array, if it is missing or stored with another dtype or shape.
  virtual Result<size_t> OpenArray(const ArraySpec& spec) = 0;
  /// A step with subfiles (ReadOptions::files): opens one stored box as an
  /// array of its own, `spec` giving its dtype, its shape (the box's counts)
  /// and its offset in subfile `file` (Marker's MarkerBox::file and
  /// file_offset). Local. Read and ReadMany take the handle, with boxes
  /// relative to the stored box. Unimplemented by readers of one file.
  virtual Result<size_t> OpenBox(const ArraySpec& spec, int64_t file);
  /// Reads `box` of an opened array into the row-major buffer `data`.
  virtual Status Read(size_t array, const Box& box, void* data) = 0;
  /// Reads every request; the buffers must not overlap. A reader may order
  /// and join them (the pread reader sorts them by file offset and reads
  /// neighbours in one request); this one reads them one by one. The first
  /// read error, naming the array and box of a request it hit; else the
  /// error of the first request (in `requests` order) whose `on_read` failed.
  virtual Status ReadMany(std::span<const ReadRequest> requests);
  /// Collective. Closes the step (and every array opened in it).
  virtual Status Close() = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  /// Collective over `comm`. Starts writing step `step` under `root`, whose
  /// step directory exists, replacing whatever an earlier attempt left.
  virtual Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                                     const Comm& comm) = 0;
  /// Collective over `comm`. Opens the arrays of step `step` under `root`
  /// (with `options.by_offset` and without `check_metadata`, local: only
  /// the data file, read-only).
  virtual Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step,
                                                   const Comm& comm,
                                                   const ReadOptions& options) = 0;
};

/// The engine for `options`: the direct engine (HDF5 layout, pwritten data)
/// for independent writes with `pwrite`, else parallel HDF5. Both store a
/// step as one data file with each array contiguous at its FileOffset, so
/// both open a reader by offset (ReadOptions::by_offset). Its readers count
/// what they read (BytesRead).
std::unique_ptr<Engine> MakeEngine(const StorageOptions& options);

/// Bytes of array data this process has read through StepReader::Read, over
/// all engines and steps: how tests and benchmarks see that a box wanted by
/// several ranks was read from storage once.
uint64_t BytesRead();

/// What this process's readers did, over all engines and steps: how tests
/// and benchmarks see which read path a restore or verify took.
struct ReadCounters {
  uint64_t dataset_opens = 0;      ///< arrays opened through HDF5 (H5Dopen)
  uint64_t offset_arrays = 0;      ///< arrays opened for reads by offset
  uint64_t offset_boxes = 0;       ///< boxes read by offset (ReadRequests)
  uint64_t offset_reads = 0;       ///< pread/preadv requests made for them, after joining
  uint64_t direct_read_bytes = 0;  ///< bytes read with O_DIRECT (aligned spans' edges included)
};
ReadCounters Counters();

}  // namespace mhckpt::io
