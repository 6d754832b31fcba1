#include "io/direct_writer.h"

#include <optional>
#include <utility>

#include <fmt/format.h>

#include "base/comm.h"
#include "base/fault.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/posix_file.h"

namespace mhckpt::io {

BoxWriteQueue::~BoxWriteQueue() { pool_.Wait().IgnoreError(); }

void BoxWriteQueue::Add(const Placement& place, const Box& box, const void* data) {
  const auto* bytes = static_cast<const std::byte*>(data);
  for (const BoxRun& r : BoxRuns(place, box)) {
    pending_.push_back({r.offset, bytes + r.at, r.size});
    pending_bytes_ += r.size;
  }
  if (pending_bytes_ >= kRawChunkBytes) SubmitPending();
}

Status BoxWriteQueue::Finish() {
  SubmitPending();
  Status s = pool_.Wait();
  return opened_.ok() ? s : opened_;
}

Status BoxWriteQueue::SyncAndClose() {
  Status s = Finish();
  Status synced = raw_.SyncAndClose();
  if (s.ok()) s = synced;
  return s;
}

void BoxWriteQueue::SubmitPending() {
  if (!pending_.empty()) pool_.Submit(&raw_, std::move(pending_));
  pending_.clear();
  pending_bytes_ = 0;
}

namespace {

class DirectStepWriter final : public StepWriter {
 public:
  // `file`: rank 0's, until laid out.
  DirectStepWriter(const Comm& comm, std::optional<H5File> file, std::string path,
                   const DirectWriterOptions& options)
      : comm_(comm),
        file_(std::move(file)),
        path_(std::move(path)),
        skeleton_(*options.skeleton),
        queue_(*options.pool) {
    queue_.Open(path_, options.direct);
  }

  // Collective: rank 0 lays out, the others learn the offsets.
  Status CreateArrays(std::span<const ArraySpec> arrays) override {
    // [outcome on rank 0 (1: ok), end of the data, offset of each array or -1]
    std::vector<int64_t> layout(arrays.size() + 2, -1);
    Status s;
    if (file_) {
      s = LayOutArrays(*file_, path_, arrays, skeleton_, layout);
      layout[0] = s.ok() ? 1 : 0;
    }
    comm_.BroadcastValues(&layout, 0);
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
    MHCKPT_RETURN_IF_ERROR(queue_.opened());
    MHCKPT_RETURN_IF_ERROR(fault::Hit("h5_write"));
    queue_.Add(placements_[array], box, data);
    return OkStatus();
  }

  Status WriteNothing(size_t) override { return OkStatus(); }

  Status FinishWrites() override { return queue_.Finish(); }

  // One fsync per rank: of its own writes and, on rank 0, of the metadata
  // HDF5 wrote at close (an fsync covers every descriptor of the file).
  Status Flush() override { return queue_.SyncAndClose(); }

 private:
  const Comm& comm_;            // the caller's, which outlives this writer
  std::optional<H5File> file_;  // rank 0, until CreateArrays closes it
  std::string path_;
  LayoutSkeleton& skeleton_;  // the engine's
  BoxWriteQueue queue_;
  uint64_t end_ = 0;
  std::vector<Placement> placements_;  // by array
};

}  // namespace

Result<std::unique_ptr<StepWriter>> CreateDirectStepWriter(const std::string& root, int64_t step,
                                                           const Comm& comm,
                                                           const DirectWriterOptions& options) {
  std::string path = DataPath(root, step);
  const int rank = comm.rank();
  std::optional<H5File> file;
  Status s;
  if (rank == 0) {
    Result<H5File> created = H5File::CreateLocal(path);
    s = created.status();
    if (s.ok()) file = std::move(created).value();
  }
  // The others open the file for their pwrites only once it exists.
  std::vector<int64_t> ok{s.ok() ? 1 : 0};
  comm.BroadcastValues(&ok, 0);
  if (rank != 0 && ok[0] != 1) s = IoError(fmt::format("rank 0 could not create '{}'", path));
  MHCKPT_RETURN_IF_ERROR(s);
  return std::unique_ptr<StepWriter>(
      std::make_unique<DirectStepWriter>(comm, std::move(file), std::move(path), options));
}

}  // namespace mhckpt::io
