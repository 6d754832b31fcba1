#include "io/direct_engine.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "base/fault.h"
#include "io/h5_engine.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/posix_file.h"
#include "io/raw_writer.h"

namespace mhckpt::io {
namespace {

// Where an array's bytes lie in the file.
struct Placement {
  std::optional<uint64_t> offset;  // none: the array has no elements
  std::vector<int64_t> shape;
  size_t element = 0;
};

// The contiguous runs of `box` in a row-major array placed at `p`, in the
// order of the box's own row-major bytes at `data`. The box is contiguous
// from the first dimension k at which every later dimension is whole; each
// index of dimensions 0..k-1 starts one run.
std::vector<RawRun> BoxRuns(const Placement& p, const Box& box, const std::byte* data) {
  std::vector<RawRun> runs;
  if (!p.offset || Volume(box.count).value_or(0) == 0) return runs;
  const size_t nd = p.shape.size();
  if (nd == 0) return {{*p.offset, data, p.element}};
  std::vector<uint64_t> stride(nd, 1);  // in elements
  for (size_t d = nd - 1; d-- > 0;)
    stride[d] = stride[d + 1] * static_cast<uint64_t>(p.shape[d + 1]);
  size_t k = nd - 1;
  while (k > 0 && box.count[k] == p.shape[k]) --k;
  const size_t run_bytes = static_cast<size_t>(box.count[k]) * stride[k] * p.element;
  std::vector<int64_t> index(k, 0);
  const std::byte* src = data;
  for (;;) {
    uint64_t e = static_cast<uint64_t>(box.start[k]) * stride[k];
    for (size_t d = 0; d < k; ++d) e += static_cast<uint64_t>(box.start[d] + index[d]) * stride[d];
    const uint64_t offset = *p.offset + e * p.element;
    if (!runs.empty() && runs.back().offset + runs.back().size == offset) {
      runs.back().size += run_bytes;  // adjacent in the file and in memory
    } else {
      runs.push_back({offset, src, run_bytes});
    }
    src += run_bytes;
    size_t d = k;
    while (d > 0 && ++index[d - 1] == box.count[d - 1]) index[--d] = 0;
    if (d == 0) return runs;
  }
}

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
    for (const RawRun& r : BoxRuns(placements_[array], box, static_cast<const std::byte*>(data))) {
      pending_.push_back(r);
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

  Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step,
                                           MPI_Comm comm) override {
    return reader_->Open(root, step, comm);
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
