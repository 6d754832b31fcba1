#include "io/direct_engine.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/box_runs.h"
#include "io/h5_engine.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/posix_file.h"
#include "io/raw_writer.h"

namespace mhckpt::io {
namespace {

// Rank 0 lays the step's file out alone, through HDF5's POSIX driver
// (H5File::CreateLocal): it creates every dataset, closes the file (HDF5
// writes its metadata) and broadcasts where each dataset's bytes lie; then
// every rank pwrites its boxes there. The other ranks never touch HDF5 while
// saving, and nobody pays for MPI-IO and collective metadata per dataset
// (10,000 small arrays: docs/PERFORMANCE.md, "Part 7").
class DirectStepWriter final : public StepWriter {
 public:
  DirectStepWriter(std::optional<H5File> file, std::string path, RawWriterPool& pool, MPI_Comm comm)
      : file_(std::move(file)), path_(std::move(path)), pool_(pool), comm_(comm) {}

  ~DirectStepWriter() override {
    // The error path: no thread may still be writing from a caller's buffer.
    pool_.Wait().IgnoreError();
  }

  // A failure is this rank's alone: it is reported by Write and
  // FinishWrites, while the rank still takes part in every collective call.
  void Open(bool direct) { opened_ = raw_.Open(path_, direct); }

  // Collective: rank 0 creates, the others learn the offsets.
  Status CreateArrays(std::span<const ArraySpec> arrays) override {
    // [outcome on rank 0 (1: ok), end of the data, offset of each array or -1]
    std::vector<int64_t> layout(arrays.size() + 2, -1);
    Status s;
    if (file_) {
      s = Layout(arrays, layout);
      layout[0] = s.ok() ? 1 : 0;
    }
    MPI_Bcast(layout.data(), static_cast<int>(layout.size()), MPI_INT64_T, 0, comm_);
    if (!file_ && layout[0] != 1) {
      s = IoError(fmt::format("rank 0 could not create the arrays of '{}'", path_));
    }
    MHCKPT_RETURN_IF_ERROR(s);
    end_ = static_cast<uint64_t>(layout[1]);
    placements_.reserve(arrays.size());
    for (size_t i = 0; i < arrays.size(); ++i) {
      const int64_t at = layout[i + 2];
      placements_.push_back({at >= 0 ? std::optional<uint64_t>(at) : std::nullopt, arrays[i].shape,
                             DTypeSize(arrays[i].dtype)});
    }
    return OkStatus();
  }

  [[nodiscard]] int64_t FileOffset(size_t array) const override {
    const std::optional<uint64_t>& offset = placements_[array].offset;
    return offset ? static_cast<int64_t>(*offset) : -1;
  }

  Status Reserve() override {
    return Preallocate(path_, end_);  // exact: see H5StepWriter::Reserve
  }

  Status Write(size_t array, const Box& box, const void* data) override {
    MHCKPT_RETURN_IF_ERROR(opened_);
    MHCKPT_RETURN_IF_ERROR(fault::Hit("h5_write"));
    // Runs wait here until they make a chunk, so that many small arrays are
    // one job for the threads, not one each.
    const auto* bytes = static_cast<const std::byte*>(data);
    for (const BoxRun& r : BoxRuns(placements_[array], box)) {
      pending_.push_back({r.offset, bytes + r.at, r.size});
      pending_bytes_ += r.size;
    }
    if (pending_bytes_ >= kRawChunkBytes) SubmitPending();
    return OkStatus();
  }

  Status WriteNothing(size_t) override { return OkStatus(); }

  Status FinishWrites() override {
    SubmitPending();
    Status s = pool_.Wait();
    return opened_.ok() ? s : opened_;
  }

  // One fsync per rank: of its own writes and, on rank 0, of the metadata
  // HDF5 wrote at close (an fsync covers every descriptor of the file).
  Status Flush() override {
    Status s = FinishWrites();
    Status synced = raw_.SyncAndClose();
    return s.ok() ? synced : s;
  }

 private:
  // Rank 0: creates the datasets, fills `layout` ([1]: end of the data, then
  // each offset) and closes the file. Why closing before anyone writes is
  // safe: HDF5 never writes raw data here (no fill, no H5Dwrite), its
  // metadata lies outside every dataset, and a page is written either only
  // directly or only through the page cache (io/raw_writer.h), so metadata
  // and array bytes sharing a page meet in the page cache.
  Status Layout(std::span<const ArraySpec> arrays, std::vector<int64_t>& layout) {
    uint64_t end = 0;
    for (size_t i = 0; i < arrays.size(); ++i) {
      const ArraySpec& a = arrays[i];
      MHCKPT_ASSIGN_OR_RETURN(Dataset ds, file_->CreateDataset(a.name, a.dtype, a.shape));
      if (std::optional<uint64_t> at = ds.OffsetInFile()) layout[i + 2] = static_cast<int64_t>(*at);
      end = std::max(end, ds.EndInFile());
    }
    layout[1] = static_cast<int64_t>(end);
    return file_->Close();
  }

  void SubmitPending() {
    if (!pending_.empty()) pool_.Submit(&raw_, pending_);
    pending_.clear();
    pending_bytes_ = 0;
  }

  std::optional<H5File> file_;  // rank 0, until CreateArrays closes it
  std::string path_;
  RawWriterPool& pool_;
  MPI_Comm comm_;
  std::vector<RawRun> pending_;  // written by Write, not yet given to the threads
  size_t pending_bytes_ = 0;
  RawFile raw_;
  Status opened_;  // of raw_
  uint64_t end_ = 0;
  std::vector<Placement> placements_;
};

class DirectEngine final : public Engine {
 public:
  DirectEngine(int threads, bool direct)
      : pool_(threads), direct_(direct), reader_(MakeH5Engine(Transfer::kIndependent)) {}

  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             MPI_Comm comm) override {
    std::string path = DataPath(root, step);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    std::optional<H5File> file;
    Status s;
    if (rank == 0) {
      Result<H5File> created = H5File::CreateLocal(path);
      s = created.status();
      if (s.ok()) file = std::move(created).value();
    }
    // The others open the file for their pwrites only once it exists.
    int ok = s.ok() ? 1 : 0;
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (rank != 0 && ok != 1) s = IoError(fmt::format("rank 0 could not create '{}'", path));
    MHCKPT_RETURN_IF_ERROR(s);
    auto writer = std::make_unique<DirectStepWriter>(std::move(file), std::move(path), pool_, comm);
    writer->Open(direct_);
    return std::unique_ptr<StepWriter>(std::move(writer));
  }

  Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step, MPI_Comm comm,
                                           const ReadOptions& options) override {
    return reader_->Open(root, step, comm, options);
  }

 private:
  RawWriterPool pool_;
  bool direct_;
  std::unique_ptr<Engine> reader_;
};

}  // namespace

std::unique_ptr<Engine> MakeDirectEngine(int threads, bool direct) {
  return std::make_unique<DirectEngine>(threads, direct);
}

}  // namespace mhckpt::io
