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
  return std::equal(
      a.begin(), a.end(), b.begin(), b.end(), [](const ArraySpec& x, const ArraySpec& y) {
        return x.name == y.name && x.dtype == y.dtype && x.shape == y.shape && x.writer == y.writer;
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
class DirectStepWriter final : public StepWriter {
 public:
  DirectStepWriter(std::optional<H5File> file, std::string path, RawWriterPool& pool,
                   const Comm& comm, Skeleton* skeleton)
      : file_(std::move(file)),
        path_(std::move(path)),
        pool_(pool),
        comm_(comm),
        skeleton_(skeleton) {}

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
  std::vector<Placement> placements_;
};

class DirectEngine final : public Engine {
 public:
  DirectEngine(int threads, bool direct)
      : pool_(threads), direct_(direct), reader_(MakeH5Engine(Transfer::kIndependent)) {}

  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             const Comm& comm) override {
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
  RawWriterPool pool_;
  bool direct_;
  std::unique_ptr<Engine> reader_;
  Skeleton skeleton_;  // rank 0's last layout
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

std::unique_ptr<Engine> MakeDirectEngine(int threads, bool direct) {
  return std::make_unique<DirectEngine>(threads, direct);
}

}  // namespace mhckpt::io
