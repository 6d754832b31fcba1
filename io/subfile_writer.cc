#include "io/subfile_writer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/direct_writer.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/posix_file.h"

namespace mhckpt::io {

SubfileGroups MakeSubfileGroups(const Comm& comm, int ranks_per_file) {
  SubfileGroups g;
  g.comm_id = comm.id();
  const auto size = static_cast<size_t>(comm.size());
  std::vector<int> leader(size, -1);
  leader[static_cast<size_t>(comm.rank())] = ranks_per_file == kFilePerNode
                                                 ? comm.SharedMemoryLeader()
                                                 : comm.rank() / ranks_per_file * ranks_per_file;
  comm.AllreduceMax(&leader);
  std::vector<int> leaders = leader;
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  g.count = static_cast<int>(leaders.size());
  g.of_rank.resize(size);
  for (size_t r = 0; r < size; ++r) {
    g.of_rank[r] = static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader[r]) -
                                    leaders.begin());
  }
  g.mine = g.of_rank[static_cast<size_t>(comm.rank())];
  g.comm = comm.Split(g.mine);
  return g;
}

namespace {

class SubfileStepWriter final : public StepWriter {
 public:
  // `subfile`: the group's first rank's, `data_file`: rank 0's, until laid out.
  SubfileStepWriter(const Comm& comm, std::optional<H5File> subfile, std::string path,
                    std::optional<H5File> data_file, std::string data_path,
                    const SubfileWriterOptions& options)
      : comm_(comm),
        groups_(*options.groups),
        subfile_(std::move(subfile)),
        path_(std::move(path)),
        data_file_(std::move(data_file)),
        data_path_(std::move(data_path)),
        subfile_skeleton_(*options.subfile_skeleton),
        data_skeleton_(*options.data_skeleton),
        lays_out_(subfile_.has_value()),
        queue_(*options.pool) {
    queue_.Open(path_, options.direct);
  }

  // Collective: the group's first rank lays its subfile out and the group
  // learns the offsets; rank 0 then makes data.h5's virtual datasets.
  Status CreateArrays(std::span<const ArraySpec> arrays) override {
    const std::vector<StoredBoxRef> boxes = SubfileBoxes(arrays, groups_.of_rank, groups_.mine);
    // [outcome at the group's first rank (1: ok), end of the data, offset of each box or -1]
    std::vector<int64_t> layout(boxes.size() + 2, -1);
    Status s;
    if (subfile_) {
      s = LayOutSubfile(*subfile_, path_, arrays, boxes, subfile_skeleton_, layout);
      layout[0] = s.ok() ? 1 : 0;
    }
    groups_.comm.BroadcastValues(&layout, 0);
    if (!subfile_ && layout[0] != 1) {
      s = IoError(
          fmt::format("the first rank of group {} could not lay out '{}'", groups_.mine, path_));
    }
    if (s.ok() && data_file_) {
      s = LayOutVirtualFile(*data_file_, data_path_, arrays, groups_.of_rank, data_skeleton_);
    }
    MHCKPT_RETURN_IF_ERROR(s);
    end_ = static_cast<uint64_t>(layout[1]);
    boxes_.assign(arrays.size(), {});
    for (size_t k = 0; k < boxes.size(); ++k) {
      const auto [i, j] = boxes[k];
      const int64_t at = layout[k + 2];
      const Box& box = arrays[i].boxes[j].box;
      boxes_[i].push_back({j,
                           box,
                           {at >= 0 ? std::optional<uint64_t>(at) : std::nullopt, box.count,
                            DTypeSize(arrays[i].dtype)}});
    }
    return OkStatus();
  }

  // Boxes lie in subfiles, not at offsets of data.h5.
  [[nodiscard]] int64_t FileOffset(size_t) const override { return -1; }

  [[nodiscard]] std::optional<BoxPlace> Place(size_t array, size_t box) const override {
    for (const StoredBox& b : boxes_[array]) {
      if (b.box == box) {
        return BoxPlace{static_cast<uint64_t>(groups_.mine), b.placement.offset.value_or(0)};
      }
    }
    return std::nullopt;
  }

  [[nodiscard]] int Files() const override { return groups_.count; }

  // The group's first rank reserves its subfile; the others nothing.
  Status Reserve() override {
    if (!lays_out_) return OkStatus();
    return Preallocate(path_, end_);  // exact: see H5StepWriter::Reserve
  }

  // A stored box, whole: its own dataset.
  Status Write(size_t array, const Box& box, const void* data) override {
    MHCKPT_RETURN_IF_ERROR(queue_.opened());
    MHCKPT_RETURN_IF_ERROR(fault::Hit("h5_write"));
    const Placement* place = nullptr;
    for (const StoredBox& b : boxes_[array]) {
      if (b.specs_box == box) place = &b.placement;
    }
    if (place == nullptr) {
      return Internal(fmt::format("'{}': box {} of array {} is not one this group writes", path_,
                                  BoxToString(box), array));
    }
    Box at = box;
    std::fill(at.start.begin(), at.start.end(), 0);
    queue_.Add(*place, at, data);
    return OkStatus();
  }

  Status WriteNothing(size_t) override { return OkStatus(); }

  Status FinishWrites() override { return queue_.Finish(); }

  // One fsync per rank of its subfile (with, on the group's first rank, the
  // metadata HDF5 wrote at close); rank 0 also of data.h5.
  Status Flush() override {
    Status s = queue_.SyncAndClose();
    if (s.ok() && comm_.rank() == 0) s = FsyncFile(data_path_);
    return s;
  }

 private:
  struct StoredBox {
    size_t box = 0;       // in ArraySpec::boxes
    Box specs_box;        // that box
    Placement placement;  // its dataset in the subfile
  };

  const Comm& comm_;  // the caller's, which outlives this writer
  const SubfileGroups& groups_;
  std::optional<H5File> subfile_;  // the group's first rank, until laid out
  std::string path_;
  std::optional<H5File> data_file_;  // rank 0, until laid out
  std::string data_path_;
  LayoutSkeleton& subfile_skeleton_;  // the engine's
  LayoutSkeleton& data_skeleton_;     // the engine's
  bool lays_out_;                     // the group's first rank
  BoxWriteQueue queue_;
  uint64_t end_ = 0;
  std::vector<std::vector<StoredBox>> boxes_;  // by array: the boxes this group stores
};

}  // namespace

Result<std::unique_ptr<StepWriter>> CreateSubfileStepWriter(const std::string& root, int64_t step,
                                                            const Comm& comm,
                                                            const SubfileWriterOptions& options) {
  const SubfileGroups& g = *options.groups;
  std::string path = SubfilePath(root, step, g.mine);
  std::optional<H5File> subfile, data_file;
  Status s;
  if (g.comm.rank() == 0) {
    Result<H5File> created = H5File::CreateLocal(path);
    s = created.status();
    if (s.ok()) subfile = std::move(created).value();
  }
  std::vector<int64_t> ok{s.ok() ? 1 : 0};
  g.comm.BroadcastValues(&ok, 0);
  if (g.comm.rank() != 0 && ok[0] != 1) {
    s = IoError(fmt::format("the first rank of group {} could not create '{}'", g.mine, path));
  }
  if (s.ok() && comm.rank() == 0) {
    Result<H5File> created = H5File::CreateLocal(DataPath(root, step), true);
    s = created.status();
    if (s.ok()) data_file = std::move(created).value();
  }
  MHCKPT_RETURN_IF_ERROR(s);
  return std::unique_ptr<StepWriter>(
      std::make_unique<SubfileStepWriter>(comm, std::move(subfile), std::move(path),
                                          std::move(data_file), DataPath(root, step), options));
}

}  // namespace mhckpt::io
