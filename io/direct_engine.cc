#include "io/direct_engine.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "base/fault.h"
#include "io/box_runs.h"
#include "io/h5_engine.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/posix_file.h"
#include "io/raw_writer.h"

namespace mhckpt::io {
namespace {

class DirectStepWriter final : public StepWriter {
 public:
  DirectStepWriter(H5File file, std::string path, RawWriterPool& pool)
      : file_(std::move(file)), path_(std::move(path)), pool_(pool) {}

  ~DirectStepWriter() override {
    // The error path: no thread may still be writing from a caller's buffer.
    pool_.Wait().IgnoreError();
  }

  // A failure is this rank's alone: it is reported by Write and
  // FinishWrites, while the rank still takes part in every collective call.
  void Open(bool direct) { opened_ = raw_.Open(path_, direct); }

  Status CreateArrays(std::span<const ArraySpec> arrays) override {
    datasets_.reserve(arrays.size());
    placements_.reserve(arrays.size());
    for (const ArraySpec& a : arrays) {
      MHCKPT_ASSIGN_OR_RETURN(Dataset ds, file_.CreateDataset(a.name, a.dtype, a.shape));
      placements_.push_back({ds.OffsetInFile(), a.shape, DTypeSize(a.dtype)});
      datasets_.push_back(std::move(ds));
    }
    return OkStatus();
  }

  [[nodiscard]] int64_t FileOffset(size_t array) const override {
    const std::optional<uint64_t>& offset = placements_[array].offset;
    return offset ? static_cast<int64_t>(*offset) : -1;
  }

  Status Reserve() override {
    uint64_t end = 0;
    for (const Dataset& d : datasets_) end = std::max(end, d.EndInFile());
    return Preallocate(path_, end);  // exact: see H5StepWriter::Reserve
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

  Status Flush() override {
    Status s = FinishWrites();
    datasets_.clear();  // every dataset is closed before the file
    Status closed = file_.Close();
    if (s.ok()) s = closed;
    Status synced = raw_.SyncAndClose();
    return s.ok() ? synced : s;
  }

 private:
  void SubmitPending() {
    if (!pending_.empty()) pool_.Submit(&raw_, pending_);
    pending_.clear();
    pending_bytes_ = 0;
  }

  H5File file_;
  std::string path_;
  RawWriterPool& pool_;
  std::vector<RawRun> pending_;  // written by Write, not yet given to the threads
  size_t pending_bytes_ = 0;
  RawFile raw_;
  Status opened_;  // of raw_
  std::vector<Dataset> datasets_;
  std::vector<Placement> placements_;
};

class DirectEngine final : public Engine {
 public:
  DirectEngine(int threads, bool direct)
      : pool_(threads), direct_(direct), reader_(MakeH5Engine(Transfer::kIndependent)) {}

  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             MPI_Comm comm) override {
    std::string path = DataPath(root, step);
    MHCKPT_ASSIGN_OR_RETURN(H5File file, H5File::Create(path, comm, Transfer::kIndependent));
    auto writer = std::make_unique<DirectStepWriter>(std::move(file), std::move(path), pool_);
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
