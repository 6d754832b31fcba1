#include "io/direct_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/comm.h"
#include "base/fault.h"
#include "base/log.h"
#include "io/box_runs.h"
#include "io/h5_engine.h"
#include "io/h5_file.h"
#include "io/h5_lock.h"
#include "io/layout.h"
#include "io/posix_file.h"
#include "io/raw_writer.h"

namespace mhckpt::io {
namespace {

std::atomic<uint64_t> g_layout_replays{0};

// The HDF5 release this file was compiled against (CMakeLists.txt), if known.
#if defined(MHCKPT_HDF5_BUILD_MAJOR) && defined(MHCKPT_HDF5_BUILD_MINOR) && \
    defined(MHCKPT_HDF5_BUILD_RELEASE)
constexpr H5Version kBuiltWith{MHCKPT_HDF5_BUILD_MAJOR, MHCKPT_HDF5_BUILD_MINOR,
                               MHCKPT_HDF5_BUILD_RELEASE};
#else
constexpr H5Version kBuiltWith{};
#endif

std::string VersionText(const H5Version& v) {
  return fmt::format("{}.{}.{}", v.major, v.minor, v.release);
}

// Rank 0, at its first layout: whether to replay layouts, said once if not.
bool ReplayAllowedHere() {
  static const bool allowed = [] {
    std::string why;
    const bool ok = LayoutReplayEnabled(&why);
    if (!ok)
      Logger()->info("mhckpt: layout replay is off, every save lays out through HDF5: {}", why);
    return ok;
  }();
  return allowed;
}

// The complement of the arrays' extents is HDF5's metadata; more than this
// is not kept (a layout of ~10,000 arrays has a few MiB).
constexpr uint64_t kMaxSkeletonBytes = uint64_t{64} << 20;

bool SameArrays(std::span<const ArraySpec> a, std::span<const ArraySpec> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const ArraySpec& x, const ArraySpec& y) {
                      return x.name == y.name && x.dtype == y.dtype && x.shape == y.shape &&
                             x.writer == y.writer && x.boxes == y.boxes;
                    });
}

// Rank 0's copy of the last layout it made (see the header): the arrays it
// was made for, the layout it broadcast, the file's length once HDF5 closed
// it, and every byte HDF5 had written — the file outside the arrays'
// extents, which no rank writes.
class Skeleton {
 public:
  /// Whether a layout of `arrays` can be replayed from here.
  [[nodiscard]] bool Fits(std::span<const ArraySpec> arrays) const {
    return !layout_.empty() && SameArrays(arrays_, arrays);
  }
  [[nodiscard]] const std::vector<int64_t>& layout() const { return layout_; }

  /// Keeps the layout HDF5 just wrote to `path` for `arrays`. Anything that
  /// goes wrong leaves nothing kept: the next save lays out through HDF5.
  void Capture(const std::string& path, std::span<const ArraySpec> arrays,
               const std::vector<int64_t>& layout) {
    Clear();
    std::vector<std::pair<uint64_t, uint64_t>> extents;  // [begin, end) of each array's bytes
    for (size_t i = 0; i < arrays.size(); ++i) {
      const std::optional<int64_t> n = Volume(arrays[i].shape);
      if (layout[i + 2] < 0 || !n || *n == 0) continue;
      const auto begin = static_cast<uint64_t>(layout[i + 2]);
      extents.emplace_back(begin, begin + static_cast<uint64_t>(*n) * DTypeSize(arrays[i].dtype));
    }
    std::sort(extents.begin(), extents.end());
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st {};
    bool ok = ::fstat(fd, &st) == 0;
    const auto size = static_cast<uint64_t>(ok ? st.st_size : 0);
    uint64_t at = 0, kept = 0;
    extents.emplace_back(size, size);  // the tail after the last array
    for (const auto& [begin, end] : extents) {
      const uint64_t stop = std::min(begin, size);
      if (ok && stop > at) ok = KeepWritten(fd, at, stop, &kept);
      at = std::max(at, end);
    }
    ::close(fd);
    if (!ok) return Clear();
    arrays_.assign(arrays.begin(), arrays.end());
    layout_ = layout;
    file_bytes_ = size;
  }

  /// Writes the kept bytes over `path` (truncated first) and sets its
  /// length: the file HDF5 would have left.
  [[nodiscard]] Status WriteTo(const std::string& path) const {
    const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) return IoError(fmt::format("open '{}': {}", path, std::strerror(errno)));
    Status s;
    for (const auto& [offset, bytes] : pieces_) {
      for (size_t done = 0; s.ok() && done < bytes.size();) {
        const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done,
                                   static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          s = IoError(fmt::format("write the layout of '{}' at byte {}: {}", path, offset + done,
                                  std::strerror(errno)));
        } else {
          done += static_cast<size_t>(n);
        }
      }
    }
    if (s.ok() && ::ftruncate(fd, static_cast<off_t>(file_bytes_)) != 0) {
      s = IoError(fmt::format("set the length of '{}': {}", path, std::strerror(errno)));
    }
    ::close(fd);
    return s;
  }

  void Clear() {
    arrays_.clear();
    layout_.clear();
    pieces_.clear();
    file_bytes_ = 0;
  }

 private:
  // Keeps the bytes of [from, to) that HDF5 wrote: the parts that are data,
  // not holes (SEEK_DATA / SEEK_HOLE; alignment gaps up to 4 MiB between
  // large datasets are holes), or all of it where the file system cannot
  // say. False on a read error or past kMaxSkeletonBytes.
  bool KeepWritten(int fd, uint64_t from, uint64_t to, uint64_t* kept) {
    while (from < to) {
      uint64_t begin = from, end = to;
      const off_t data = ::lseek(fd, static_cast<off_t>(from), SEEK_DATA);
      if (data < 0 && errno == ENXIO) return true;  // nothing but a hole to the end
      if (data >= 0) {
        begin = static_cast<uint64_t>(data);
        const off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole >= 0) end = std::min(to, static_cast<uint64_t>(hole));
      }
      if (begin >= to) return true;
      *kept += end - begin;
      if (*kept > kMaxSkeletonBytes || !ReadPiece(fd, begin, end - begin)) return false;
      from = end;
    }
    return true;
  }

  bool ReadPiece(int fd, uint64_t offset, uint64_t size) {
    std::string bytes(static_cast<size_t>(size), '\0');
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n =
          ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    pieces_.emplace_back(offset, std::move(bytes));
    return true;
  }

  std::vector<ArraySpec> arrays_;
  std::vector<int64_t> layout_;  // as broadcast: [1, end, offsets...]
  uint64_t file_bytes_ = 0;
  std::vector<std::pair<uint64_t, std::string>> pieces_;
};

// Rank 0 lays the step's file out alone, through HDF5's POSIX driver
// (H5File::CreateLocal): it creates every dataset, closes the file (HDF5
// writes its metadata) and broadcasts where each dataset's bytes lie; then
// every rank pwrites its boxes there. The other ranks never touch HDF5 while
// saving, and nobody pays for MPI-IO and collective metadata per dataset
// (10,000 small arrays: docs/PERFORMANCE.md, "Many small arrays").
// Subfiles: which group, and so which subfile, each rank writes.
struct Groups {
  MPI_Comm of = MPI_COMM_NULL;  // the communicator they were made for
  std::vector<int> of_rank;     // the group of each rank
  int count = 0;
  int mine = 0;
  Comm comm;  // this rank's group; its rank 0 (the group's lowest) lays the subfile out
};

// Collective over `comm`: groups of `ranks_per_file` consecutive ranks, or
// (kFilePerNode) of the ranks sharing memory, numbered in the order of their
// lowest ranks.
Groups MakeGroups(const Comm& comm, int ranks_per_file) {
  Groups g;
  g.of = comm.get();
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

// The dataset of box `box` of array `array` in its subfile.
std::string BoxDatasetName(size_t array, size_t box) {
  return fmt::format("box_{}_{}", array, box);
}

class DirectStepWriter final : public StepWriter {
 public:
  DirectStepWriter(std::optional<H5File> file, std::string path, RawWriterPool& pool,
                   const Comm& comm, Skeleton* skeleton, const Groups* groups = nullptr,
                   std::optional<H5File> virtual_file = std::nullopt, std::string virtual_path = {},
                   Skeleton* virtual_skeleton = nullptr)
      : file_(std::move(file)),
        path_(std::move(path)),
        pool_(pool),
        comm_(comm),
        skeleton_(skeleton),
        groups_(groups),
        virtual_file_(std::move(virtual_file)),
        virtual_path_(std::move(virtual_path)),
        virtual_skeleton_(virtual_skeleton) {}

  ~DirectStepWriter() override {
    // The error path: no thread may still be writing from a caller's buffer.
    pool_.Wait().IgnoreError();
  }

  // A failure is this rank's alone: it is reported by Write and
  // FinishWrites, while the rank still takes part in every collective call.
  void Open(bool direct) { opened_ = raw_.Open(path_, direct); }

  // Collective: rank 0 creates, the others learn the offsets.
  Status CreateArrays(std::span<const ArraySpec> arrays) override {
    if (groups_ != nullptr) return CreateBoxes(arrays);
    // [outcome on rank 0 (1: ok), end of the data, offset of each array or -1]
    std::vector<int64_t> layout(arrays.size() + 2, -1);
    Status s;
    if (file_) {
      s = Layout(arrays, layout);
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
    if (groups_ != nullptr) return -1;
    const std::optional<uint64_t>& offset = placements_[array].offset;
    return offset ? static_cast<int64_t>(*offset) : -1;
  }

  [[nodiscard]] std::optional<BoxPlace> Place(size_t array, size_t box) const override {
    if (groups_ == nullptr) return std::nullopt;
    for (const GroupBox& g : group_boxes_[array]) {
      if (g.box == box) {
        return BoxPlace{static_cast<uint64_t>(groups_->mine),
                        placements_[g.placement].offset.value_or(0)};
      }
    }
    return std::nullopt;
  }

  [[nodiscard]] int Files() const override { return groups_ != nullptr ? groups_->count : 0; }

  // With subfiles, the group's first rank reserves its subfile; the others nothing.
  Status Reserve() override {
    if (groups_ != nullptr && !file_reserver_) return OkStatus();
    return Preallocate(path_, end_);  // exact: see H5StepWriter::Reserve
  }

  Status Write(size_t array, const Box& box, const void* data) override {
    MHCKPT_RETURN_IF_ERROR(opened_);
    MHCKPT_RETURN_IF_ERROR(fault::Hit("h5_write"));
    const Placement* place = &placements_[array];
    Box at = box;
    if (groups_ != nullptr) {  // a stored box, whole: its own dataset
      place = nullptr;
      for (const GroupBox& g : group_boxes_[array]) {
        if (g.specs_box == box) place = &placements_[g.placement];
      }
      if (place == nullptr) {
        return Internal(fmt::format("'{}': box {} of array {} is not one this group writes", path_,
                                    BoxToString(box), array));
      }
      std::fill(at.start.begin(), at.start.end(), 0);
    }
    // Runs wait here until they make a chunk, so that many small arrays are
    // one job for the threads, not one each.
    const auto* bytes = static_cast<const std::byte*>(data);
    for (const BoxRun& r : BoxRuns(*place, at)) {
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
    if (s.ok()) s = synced;
    // With subfiles, rank 0 also made data.h5 (virtual datasets only).
    if (s.ok() && groups_ != nullptr && comm_.rank() == 0) s = FsyncFile(virtual_path_);
    return s;
  }

 private:
  // Rank 0: creates the datasets, fills `layout` ([1]: end of the data, then
  // each offset) and closes the file. Why closing before anyone writes is
  // safe: HDF5 never writes raw data here (no fill, no H5Dwrite), its
  // metadata lies outside every dataset, and a page is written either only
  // directly or only through the page cache (io/raw_writer.h), so metadata
  // and array bytes sharing a page meet in the page cache.
  //
  // The same arrays as the last layout (names, dtypes, shapes, writers, in
  // order): HDF5 would write the same metadata at the same addresses, so the
  // kept bytes are written instead (Skeleton), over the empty file HDF5 made.
  Status Layout(std::span<const ArraySpec> arrays, std::vector<int64_t>& layout) {
    // One sequence of HDF5 calls, waiting for no other process: held here
    // whole, so another manager's HDF5 calls do not interleave with it.
    H5LocalGuard guard;
    const bool replay = ReplayAllowedHere();
    if (replay && skeleton_->Fits(arrays)) {
      Status s = file_->Close();
      if (s.ok()) s = skeleton_->WriteTo(path_);
      if (!s.ok()) {
        skeleton_->Clear();
        return s;
      }
      layout = skeleton_->layout();
      g_layout_replays.fetch_add(1, std::memory_order_relaxed);
      return OkStatus();
    }
    // Each writer's arrays side by side, in their order (ArraySpec::writer):
    // HDF5 packs small datasets created one after another, so a rank's small
    // arrays make long runs that its pieces join (io/raw_writer.h) instead
    // of alternating with other ranks' arrays.
    std::vector<size_t> order(arrays.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return arrays[x].writer < arrays[y].writer; });
    uint64_t end = 0;
    for (const size_t i : order) {
      const ArraySpec& a = arrays[i];
      MHCKPT_ASSIGN_OR_RETURN(Dataset ds, file_->CreateDataset(a.name, a.dtype, a.shape));
      if (std::optional<uint64_t> at = ds.OffsetInFile()) layout[i + 2] = static_cast<int64_t>(*at);
      end = std::max(end, ds.EndInFile());
    }
    layout[1] = static_cast<int64_t>(end);
    MHCKPT_RETURN_IF_ERROR(file_->Close());
    layout[0] = 1;  // as broadcast
    if (replay) skeleton_->Capture(path_, arrays, layout);
    return OkStatus();
  }

  // Subfiles: the group's first rank creates one dataset per box of its
  // group (by writer, so that a rank's boxes lie side by side) and closes the
  // subfile; the group learns the offsets. Rank 0 then makes data.h5's
  // virtual datasets, one per array, mapping its boxes onto the subfiles.
  Status CreateBoxes(std::span<const ArraySpec> arrays) {
    const Groups& g = *groups_;
    std::vector<std::pair<size_t, size_t>> boxes;  // (array, box) written by this group
    group_boxes_.assign(arrays.size(), {});
    for (size_t i = 0; i < arrays.size(); ++i) {
      for (size_t j = 0; j < arrays[i].boxes.size(); ++j) {
        const int writer = arrays[i].boxes[j].writer;
        if (writer >= 0 && static_cast<size_t>(writer) < g.of_rank.size() &&
            g.of_rank[static_cast<size_t>(writer)] == g.mine) {
          boxes.emplace_back(i, j);
        }
      }
    }
    std::stable_sort(boxes.begin(), boxes.end(), [&](const auto& x, const auto& y) {
      return arrays[x.first].boxes[x.second].writer < arrays[y.first].boxes[y.second].writer;
    });
    // [outcome at the group's first rank (1: ok), end of the data, offset of each box or -1]
    std::vector<int64_t> layout(boxes.size() + 2, -1);
    Status s;
    if (file_) {
      s = LayoutBoxes(arrays, boxes, layout);
      layout[0] = s.ok() ? 1 : 0;
    }
    g.comm.BroadcastValues(&layout, 0);
    if (!file_ && layout[0] != 1) {
      s = IoError(fmt::format("the first rank of group {} could not lay out '{}'", g.mine, path_));
    }
    if (s.ok() && virtual_file_) s = LayoutVirtual(arrays);
    MHCKPT_RETURN_IF_ERROR(s);
    end_ = static_cast<uint64_t>(layout[1]);
    for (size_t k = 0; k < boxes.size(); ++k) {
      const auto [i, j] = boxes[k];
      const int64_t at = layout[k + 2];
      const Box& box = arrays[i].boxes[j].box;
      placements_.push_back({at >= 0 ? std::optional<uint64_t>(at) : std::nullopt, box.count,
                             DTypeSize(arrays[i].dtype)});
      group_boxes_[i].push_back({j, box, placements_.size() - 1});
    }
    return OkStatus();
  }

  // The group's boxes, each an array of its own (by writer already), laid
  // out as Layout lays out arrays: replayed when they are the last ones.
  Status LayoutBoxes(std::span<const ArraySpec> arrays,
                     std::span<const std::pair<size_t, size_t>> boxes,
                     std::vector<int64_t>& layout) {
    std::vector<ArraySpec> own;
    own.reserve(boxes.size());
    for (const auto& [i, j] : boxes) {
      const BoxSpec& b = arrays[i].boxes[j];
      own.push_back({BoxDatasetName(i, j), arrays[i].dtype, b.box.count, -1, b.writer, {}});
    }
    file_reserver_ = true;
    return Layout(own, layout);
  }

  // data.h5 holds only HDF5 metadata: replayed whole for the same arrays,
  // boxes and writers (the groups are the engine's, fixed).
  Status LayoutVirtual(std::span<const ArraySpec> arrays) {
    H5LocalGuard guard;
    const bool replay = ReplayAllowedHere();
    if (replay && virtual_skeleton_->Fits(arrays)) {
      Status s = virtual_file_->Close();
      if (s.ok()) s = virtual_skeleton_->WriteTo(virtual_path_);
      if (!s.ok()) virtual_skeleton_->Clear();
      if (s.ok()) g_layout_replays.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
    std::vector<H5File::VirtualSource> sources;
    for (size_t i = 0; i < arrays.size(); ++i) {
      sources.clear();
      for (size_t j = 0; j < arrays[i].boxes.size(); ++j) {
        const BoxSpec& b = arrays[i].boxes[j];
        if (Volume(b.box.count).value_or(0) == 0) continue;
        sources.push_back({b.box, SubfileName(groups_->of_rank[static_cast<size_t>(b.writer)]),
                           "/" + BoxDatasetName(i, j)});
      }
      MHCKPT_RETURN_IF_ERROR(virtual_file_->CreateVirtualDataset(arrays[i].name, arrays[i].dtype,
                                                                 arrays[i].shape, sources));
    }
    MHCKPT_RETURN_IF_ERROR(virtual_file_->Close());
    if (replay) {  // nothing but metadata: no extents to leave out
      std::vector<int64_t> none(arrays.size() + 2, -1);
      none[0] = 1;
      virtual_skeleton_->Capture(virtual_path_, arrays, none);
    }
    return OkStatus();
  }

  void SubmitPending() {
    if (!pending_.empty()) pool_.Submit(&raw_, std::move(pending_));
    pending_.clear();
    pending_bytes_ = 0;
  }

  std::optional<H5File> file_;  // rank 0, until CreateArrays closes it
  std::string path_;
  RawWriterPool& pool_;
  const Comm& comm_;             // the caller's, which outlives this writer
  Skeleton* skeleton_;           // the engine's
  std::vector<RawRun> pending_;  // written by Write, not yet given to the threads
  size_t pending_bytes_ = 0;
  RawFile raw_;
  Status opened_;  // of raw_
  uint64_t end_ = 0;
  std::vector<Placement> placements_;  // by array; with subfiles, by box of the group
  // Subfiles (else null): the groups, and rank 0's data.h5 until laid out.
  const Groups* groups_;
  std::optional<H5File> virtual_file_;
  std::string virtual_path_;
  Skeleton* virtual_skeleton_;  // the engine's, for data.h5
  bool file_reserver_ = false;  // laid the subfile out
  struct GroupBox {
    size_t box = 0;        // in ArraySpec::boxes
    Box specs_box;         // that box
    size_t placement = 0;  // in placements_
  };
  std::vector<std::vector<GroupBox>> group_boxes_;  // by array
};

class DirectEngine final : public Engine {
 public:
  DirectEngine(int threads, bool direct, int ranks_per_file)
      : pool_(threads),
        direct_(direct),
        ranks_per_file_(ranks_per_file),
        reader_(MakeH5Engine(Transfer::kIndependent)) {}

  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             const Comm& comm) override {
    if (ranks_per_file_ != 0) return CreateSubfiles(root, step, comm);
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
    auto writer = std::make_unique<DirectStepWriter>(std::move(file), std::move(path), pool_, comm,
                                                     &skeleton_);
    writer->Open(direct_);
    return std::unique_ptr<StepWriter>(std::move(writer));
  }

  Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step, const Comm& comm,
                                           const ReadOptions& options) override {
    return reader_->Open(root, step, comm, options);
  }

 private:
  // Subfiles: each group's first rank creates its subfile, and rank 0 data.h5.
  Result<std::unique_ptr<StepWriter>> CreateSubfiles(const std::string& root, int64_t step,
                                                     const Comm& comm) {
    if (!groups_ || groups_->of != comm.get()) {
      groups_ = MakeGroups(comm, ranks_per_file_);
      skeleton_.Clear();  // laid out for other groups
      virtual_skeleton_.Clear();
    }
    const Groups& g = *groups_;
    std::string path = SubfilePath(root, step, g.mine);
    std::optional<H5File> file, virtual_file;
    Status s;
    if (g.comm.rank() == 0) {
      Result<H5File> created = H5File::CreateLocal(path);
      s = created.status();
      if (s.ok()) file = std::move(created).value();
    }
    std::vector<int64_t> ok{s.ok() ? 1 : 0};
    g.comm.BroadcastValues(&ok, 0);
    if (g.comm.rank() != 0 && ok[0] != 1) {
      s = IoError(fmt::format("the first rank of group {} could not create '{}'", g.mine, path));
    }
    if (s.ok() && comm.rank() == 0) {
      Result<H5File> created = H5File::CreateLocal(DataPath(root, step), true);
      s = created.status();
      if (s.ok()) virtual_file = std::move(created).value();
    }
    MHCKPT_RETURN_IF_ERROR(s);
    auto writer = std::make_unique<DirectStepWriter>(std::move(file), std::move(path), pool_, comm,
                                                     &skeleton_, &g, std::move(virtual_file),
                                                     DataPath(root, step), &virtual_skeleton_);
    writer->Open(direct_);
    return std::unique_ptr<StepWriter>(std::move(writer));
  }

  RawWriterPool pool_;
  bool direct_;
  int ranks_per_file_;
  std::optional<Groups> groups_;  // with subfiles, from the first Create on
  std::unique_ptr<Engine> reader_;
  Skeleton skeleton_;          // rank 0's last layout (with subfiles: its group's)
  Skeleton virtual_skeleton_;  // with subfiles, rank 0's last data.h5
};

}  // namespace

uint64_t LayoutReplays() { return g_layout_replays.load(std::memory_order_relaxed); }

bool LayoutReplayEnabled(std::string* why_not) {
  const H5Version running = H5LibraryVersion();
  const std::string wanted =
      fmt::format("{}.{}.{}", kReplayHdf5Major, kReplayHdf5Minor, kReplayHdf5Release);
  std::string why;
  if (!LayoutReplayFitsHdf5(kBuiltWith.major, kBuiltWith.minor, kBuiltWith.release)) {
    why = fmt::format("mhckpt was compiled against HDF5 {}; replay is written for {}",
                      VersionText(kBuiltWith), wanted);
  } else if (!LayoutReplayFitsHdf5(running.major, running.minor, running.release)) {
    why = fmt::format("the HDF5 loaded is {}; replay is written for {}", VersionText(running),
                      wanted);
  }
  if (why_not != nullptr) *why_not = why;
  return why.empty();
}

std::unique_ptr<Engine> MakeDirectEngine(int threads, bool direct, int ranks_per_file) {
  return std::make_unique<DirectEngine>(threads, direct, ranks_per_file);
}

}  // namespace mhckpt::io
