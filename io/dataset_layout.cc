#include "io/dataset_layout.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "base/log.h"
#include "io/h5_lock.h"
#include "io/layout.h"

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

// At the first layout: whether to replay layouts, said once if not.
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

}  // namespace

bool LayoutSkeleton::Fits(std::span<const ArraySpec> arrays) const {
  return !layout_.empty() && SameArrays(arrays_, arrays);
}

void LayoutSkeleton::Capture(const std::string& path, std::span<const ArraySpec> arrays,
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

Status LayoutSkeleton::WriteTo(const std::string& path) const {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return IoError(fmt::format("open '{}': {}", path, std::strerror(errno)));
  Status s;
  for (const auto& [offset, bytes] : pieces_) {
    for (size_t done = 0; s.ok() && done < bytes.size();) {
      const ssize_t n =
          ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
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

void LayoutSkeleton::Clear() {
  arrays_.clear();
  layout_.clear();
  pieces_.clear();
  file_bytes_ = 0;
}

// Keeps the bytes of [from, to) that HDF5 wrote: the parts that are data,
// not holes (SEEK_DATA / SEEK_HOLE; alignment gaps up to 4 MiB between
// large datasets are holes), or all of it where the file system cannot
// say. False on a read error or past kMaxSkeletonBytes.
bool LayoutSkeleton::KeepWritten(int fd, uint64_t from, uint64_t to, uint64_t* kept) {
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

bool LayoutSkeleton::ReadPiece(int fd, uint64_t offset, uint64_t size) {
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

// The same arrays as the last layout (names, dtypes, shapes, writers, in
// order): HDF5 would write the same metadata at the same addresses, so the
// kept bytes are written instead, over the empty file HDF5 made.
Status LayOutArrays(H5File& file, const std::string& path, std::span<const ArraySpec> arrays,
                    LayoutSkeleton& skeleton, std::vector<int64_t>& layout) {
  // One sequence of HDF5 calls, waiting for no other process: held here
  // whole, so another manager's HDF5 calls do not interleave with it.
  H5LocalGuard guard;
  const bool replay = ReplayAllowedHere();
  if (replay && skeleton.Fits(arrays)) {
    Status s = file.Close();
    if (s.ok()) s = skeleton.WriteTo(path);
    if (!s.ok()) {
      skeleton.Clear();
      return s;
    }
    layout = skeleton.layout();
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
    MHCKPT_ASSIGN_OR_RETURN(Dataset ds, file.CreateDataset(a.name, a.dtype, a.shape));
    if (std::optional<uint64_t> at = ds.OffsetInFile()) layout[i + 2] = static_cast<int64_t>(*at);
    end = std::max(end, ds.EndInFile());
  }
  layout[1] = static_cast<int64_t>(end);
  MHCKPT_RETURN_IF_ERROR(file.Close());
  layout[0] = 1;  // as broadcast
  if (replay) skeleton.Capture(path, arrays, layout);
  return OkStatus();
}

std::vector<StoredBoxRef> SubfileBoxes(std::span<const ArraySpec> arrays,
                                       std::span<const int> group_of_rank, int group) {
  std::vector<StoredBoxRef> boxes;
  for (size_t i = 0; i < arrays.size(); ++i) {
    for (size_t j = 0; j < arrays[i].boxes.size(); ++j) {
      const int writer = arrays[i].boxes[j].writer;
      if (writer >= 0 && static_cast<size_t>(writer) < group_of_rank.size() &&
          group_of_rank[static_cast<size_t>(writer)] == group) {
        boxes.push_back({i, j});
      }
    }
  }
  std::stable_sort(boxes.begin(), boxes.end(), [&](const StoredBoxRef& x, const StoredBoxRef& y) {
    return arrays[x.array].boxes[x.box].writer < arrays[y.array].boxes[y.box].writer;
  });
  return boxes;
}

std::string BoxDatasetName(size_t array, size_t box) {
  return fmt::format("box_{}_{}", array, box);
}

Status LayOutSubfile(H5File& file, const std::string& path, std::span<const ArraySpec> arrays,
                     std::span<const StoredBoxRef> boxes, LayoutSkeleton& skeleton,
                     std::vector<int64_t>& layout) {
  std::vector<ArraySpec> own;
  own.reserve(boxes.size());
  for (const auto& [i, j] : boxes) {
    const BoxSpec& b = arrays[i].boxes[j];
    own.push_back({BoxDatasetName(i, j), arrays[i].dtype, b.box.count, -1, b.writer, {}});
  }
  return LayOutArrays(file, path, own, skeleton, layout);
}

Status LayOutVirtualFile(H5File& file, const std::string& path, std::span<const ArraySpec> arrays,
                         std::span<const int> group_of_rank, LayoutSkeleton& skeleton) {
  H5LocalGuard guard;
  const bool replay = ReplayAllowedHere();
  if (replay && skeleton.Fits(arrays)) {
    Status s = file.Close();
    if (s.ok()) s = skeleton.WriteTo(path);
    if (!s.ok()) skeleton.Clear();
    if (s.ok()) g_layout_replays.fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  std::vector<H5File::VirtualSource> sources;
  for (size_t i = 0; i < arrays.size(); ++i) {
    sources.clear();
    for (size_t j = 0; j < arrays[i].boxes.size(); ++j) {
      const BoxSpec& b = arrays[i].boxes[j];
      if (Volume(b.box.count).value_or(0) == 0) continue;
      sources.push_back({b.box, SubfileName(group_of_rank[static_cast<size_t>(b.writer)]),
                         "/" + BoxDatasetName(i, j)});
    }
    MHCKPT_RETURN_IF_ERROR(
        file.CreateVirtualDataset(arrays[i].name, arrays[i].dtype, arrays[i].shape, sources));
  }
  MHCKPT_RETURN_IF_ERROR(file.Close());
  if (replay) {  // nothing but metadata: no extents to leave out
    std::vector<int64_t> none(arrays.size() + 2, -1);
    none[0] = 1;
    skeleton.Capture(path, arrays, none);
  }
  return OkStatus();
}

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

}  // namespace mhckpt::io
