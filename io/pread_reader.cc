#include "io/pread_reader.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/box_runs.h"
#include "io/read_counters.h"

namespace mhckpt::io {
namespace {

// Pieces of one joined request, the gaps' included.
constexpr size_t kMaxPieces = IOV_MAX;
// Bytes announced (POSIX_FADV_WILLNEED) ahead of the read being made.
constexpr uint64_t kWillNeedBytes = uint64_t{64} << 20;

// preadv behind the fault seam (point `pread`): EIO, EINTR, or a short read
// (half the bytes asked for, at least one).
ssize_t SysPreadv(int fd, const iovec* iov, int count, uint64_t offset) {
  if (int e = fault::Errno("pread")) return errno = e, -1;
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  const size_t allowed = fault::ShortWrite("pread", total);
  if (allowed == total) return ::preadv(fd, iov, count, static_cast<off_t>(offset));
  std::vector<iovec> cut;  // the first `allowed` bytes of `iov`
  size_t taken = 0;
  for (int i = 0; i < count && taken < allowed; ++i) {
    cut.push_back(iov[i]);
    cut.back().iov_len = std::min(iov[i].iov_len, allowed - taken);
    taken += cut.back().iov_len;
  }
  return ::preadv(fd, cut.data(), static_cast<int>(cut.size()), static_cast<off_t>(offset));
}

// One contiguous run of a request: `size` bytes at file offset `offset`
// into `dst`.
struct Segment {
  uint64_t offset = 0;
  size_t size = 0;
  std::byte* dst = nullptr;
  size_t request = 0;  // its index in the batch
};

// One joined request: segments [first, last) of the sorted list.
struct Joined {
  size_t first = 0;
  size_t last = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Joins the sorted `segs` into requests (see the header).
std::vector<Joined> Join(const std::vector<Segment>& segs) {
  std::vector<Joined> out;
  size_t pieces = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    if (!out.empty()) {
      Joined& j = out.back();
      const bool fits = s.offset >= j.end && s.offset - j.end <= kJoinGapBytes &&
                        s.offset + s.size - j.begin <= kMaxJoinedBytes && pieces + 2 <= kMaxPieces;
      if (fits) {
        pieces += s.offset > j.end ? 2 : 1;
        j.last = i + 1;
        j.end = s.offset + s.size;
        continue;
      }
    }
    out.push_back({i, i + 1, s.offset, s.offset + s.size});
    pieces = 1;
  }
  return out;
}

// Announces the joined requests `joined[from..]` to the kernel
// (POSIX_FADV_WILLNEED) while they start less than kWillNeedBytes after
// request `reading` (always through `reading` itself). Returns the first
// request not announced.
size_t Announce(int fd, const std::vector<Joined>& joined, size_t from, size_t reading) {
  for (; from < joined.size(); ++from) {
    const Joined& n = joined[from];
    if (from > reading && n.begin - joined[reading].begin >= kWillNeedBytes) break;
    (void)::posix_fadvise(fd, static_cast<off_t>(n.begin), static_cast<off_t>(n.end - n.begin),
                          POSIX_FADV_WILLNEED);
  }
  return from;
}

// The thread that runs ahead of a batch's reads (see the header): it
// announces the requests to the kernel, then faults in the destination
// pages of the requests after the one being read, and sleeps when it is
// done until the reads move on.
class ReadAhead {
 public:
  ReadAhead(int fd, const std::vector<Segment>& segs, const std::vector<Joined>& joined)
      : fd_(fd), segs_(segs), joined_(joined), thread_([this] { Run(); }) {}
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;
  ~ReadAhead() {
    reading_.store(kStopped);
    reading_.notify_one();
    thread_.join();
  }

  /// The reads have reached joined request `j`.
  void Reading(size_t j) {
    reading_.store(j);
    reading_.notify_one();
  }

 private:
  static constexpr size_t kStopped = SIZE_MAX;

  void Run() {
    const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    size_t announced = 0;
    size_t next = 1;  // the request whose pages are faulted in next
    bool prefault = true;
    for (;;) {
      const size_t r = reading_.load();
      if (r == kStopped) return;
      announced = Announce(fd_, joined_, announced, r);
      next = std::max(next, r + 1);  // never the request being read
      if (!prefault || next >= joined_.size()) {
        if (announced == joined_.size()) return;
        reading_.wait(r);  // until the reads move on
        continue;
      }
      for (size_t i = joined_[next].first; prefault && i < joined_[next].last; ++i) {
        // The whole pages of the segment: past `head` bytes, short of `tail`.
        const Segment& s = segs_[i];
        const auto at = reinterpret_cast<uintptr_t>(s.dst);
        const size_t head = (page - at % page) % page;
        const size_t tail = (at + s.size) % page;
        // Any refusal ends the prefaulting: the reads fault the pages themselves.
        prefault = s.size <= head + tail ||
                   ::madvise(s.dst + head, s.size - head - tail, MADV_POPULATE_WRITE) == 0;
      }
      ++next;
    }
  }

  int fd_;
  const std::vector<Segment>& segs_;
  const std::vector<Joined>& joined_;
  std::atomic<size_t> reading_{0};
  std::thread thread_;  // last: it starts with the members above set
};

class PreadReader final : public StepReader {
 public:
  PreadReader(int fd, Status opened, std::string path, int64_t step,
              std::unique_ptr<StepReader> metadata, bool prefault)
      : fd_(fd),
        opened_(std::move(opened)),
        path_(std::move(path)),
        step_(step),
        metadata_(std::move(metadata)),
        prefault_(prefault) {}
  PreadReader(const PreadReader&) = delete;
  PreadReader& operator=(const PreadReader&) = delete;
  ~PreadReader() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Result<size_t> OpenArray(const ArraySpec& spec) override {
    if (metadata_) MHCKPT_RETURN_IF_ERROR(metadata_->OpenArray(spec).status());
    const bool empty = Volume(spec.shape).value_or(0) == 0;
    if (!empty && spec.offset < 0) {
      return InvalidArgument(
          fmt::format("step {}: array '{}': no file offset to read it at", step_, spec.name));
    }
    Placement p;
    if (!empty) p.offset = static_cast<uint64_t>(spec.offset);
    p.shape = spec.shape;
    p.element = DTypeSize(spec.dtype);
    arrays_.push_back({spec.name, std::move(p)});
    CountOffsetArray();
    return arrays_.size() - 1;
  }

  Status Read(size_t array, const Box& box, void* data) override {
    const ReadRequest r{array, box, data};
    return ReadMany({&r, 1});
  }

  Status ReadMany(std::span<const ReadRequest> requests) override;

  Status Close() override {
    if (fd_ >= 0) ::close(fd_);  // read-only: nothing to lose
    fd_ = -1;
    return metadata_ ? metadata_->Close() : OkStatus();
  }

 private:
  struct Array {
    std::string name;
    Placement placement;
  };

  std::vector<Segment> Segments(std::span<const ReadRequest> requests) const;
  Status ReadJoined(const std::vector<Segment>& segs, const Joined& j);
  Status Fail(const ReadRequest& r, const Status& cause) const;

  int fd_;
  Status opened_;  // of fd_: an error here is returned by every read
  std::string path_;
  int64_t step_;
  std::unique_ptr<StepReader> metadata_;
  bool prefault_;
  std::vector<Array> arrays_;       // by handle
  std::vector<std::byte> scratch_;  // where the gaps of joined requests go
  std::vector<iovec> iov_;
};

std::vector<Segment> PreadReader::Segments(std::span<const ReadRequest> requests) const {
  std::vector<Segment> segs;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& r = requests[i];
    auto* dst = static_cast<std::byte*>(r.data);
    for (const BoxRun& run : BoxRuns(arrays_[r.array].placement, r.box)) {
      uint64_t at = 0;
      do {  // pieces of at most kPieceBytes (one, if the run is empty)
        const auto size = static_cast<size_t>(std::min<uint64_t>(run.size - at, kPieceBytes));
        segs.push_back({run.offset + at, size, dst + run.at + at, i});
        at += size;
      } while (at < run.size);
    }
  }
  std::stable_sort(segs.begin(), segs.end(),
                   [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
  return segs;
}

Status PreadReader::ReadMany(std::span<const ReadRequest> requests) {
  const std::vector<Segment> segs = Segments(requests);
  const std::vector<Joined> joined = Join(segs);
  MHCKPT_RETURN_IF_ERROR(opened_);
  uint64_t bytes = 0;
  for (const Segment& s : segs) bytes += s.size;
  // Why WILLNEED ahead of the reads: the kernel reads the next requests
  // while the current one is served. A window, not the whole batch, so a
  // huge restore does not push its own pages out before they are read.
  // With prefaulting, the thread that faults in the pages announces them
  // too, so that the kernel's page-cache work also leaves the reads' thread.
  std::optional<ReadAhead> ahead;  // joined before `segs` and `joined` go
  if (prefault_ && joined.size() > 1 && bytes >= kPrefaultMinBytes) {
    ahead.emplace(fd_, segs, joined);
  }
  size_t announced = 0;
  for (size_t k = 0; k < joined.size(); ++k) {
    if (ahead) {
      ahead->Reading(k);
    } else {
      announced = Announce(fd_, joined, announced, k);
    }
    Status s = ReadJoined(segs, joined[k]);
    if (!s.ok()) return Fail(requests[segs[joined[k].first].request], s);
  }
  CountOffsetReads(requests.size(), joined.size());
  return OkStatus();
}

// Reads one joined request, retrying EINTR and short reads.
Status PreadReader::ReadJoined(const std::vector<Segment>& segs, const Joined& j) {
  iov_.clear();
  if (scratch_.empty()) scratch_.resize(kJoinGapBytes);  // every gap fits; never resized after
  uint64_t end = j.begin;
  for (size_t i = j.first; i < j.last; ++i) {
    if (segs[i].offset > end) {
      const size_t gap = static_cast<size_t>(segs[i].offset - end);
      iov_.push_back({scratch_.data(), gap});
    }
    iov_.push_back({segs[i].dst, segs[i].size});
    end = segs[i].offset + segs[i].size;
  }
  uint64_t offset = j.begin;
  size_t k = 0;
  while (k < iov_.size()) {
    const int count = static_cast<int>(std::min(iov_.size() - k, kMaxPieces));
    const ssize_t n = SysPreadv(fd_, &iov_[k], count, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return IoError(fmt::format("pread '{}' at byte {}: {}", path_, offset, std::strerror(errno)));
    if (n == 0) {
      return DataLoss(fmt::format("'{}' ends before byte {} (truncated?)", path_, offset));
    }
    offset += static_cast<uint64_t>(n);
    for (auto left = static_cast<size_t>(n); left > 0;) {  // skip what was read
      const size_t take = std::min(left, iov_[k].iov_len);
      iov_[k].iov_base = static_cast<std::byte*>(iov_[k].iov_base) + take;
      iov_[k].iov_len -= take;
      left -= take;
      if (iov_[k].iov_len == 0) ++k;
    }
  }
  return OkStatus();
}

// `cause`, named with the step, the array and the box of request `r`.
Status PreadReader::Fail(const ReadRequest& r, const Status& cause) const {
  return Status(cause.code(),
                fmt::format("step {}: array '{}' box {}: {}", step_, arrays_[r.array].name,
                            BoxToString(r.box), cause.message()));
}

}  // namespace

Result<std::unique_ptr<StepReader>> OpenPreadReader(const std::string& path, int64_t step,
                                                    std::unique_ptr<StepReader> metadata,
                                                    bool prefault) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  Status opened;
  if (fd < 0) {
    opened = IoError(
        fmt::format("step {}: open '{}' for reading: {}", step, path, std::strerror(errno)));
    // Without a metadata reader, nothing collective follows: fail here. With
    // one, its OpenArray and Close calls are collective, so this rank keeps
    // making them and its reads return the error.
    if (!metadata) return opened;
  } else {
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  return std::unique_ptr<StepReader>(std::make_unique<PreadReader>(
      fd, std::move(opened), path, step, std::move(metadata), prefault));
}

}  // namespace mhckpt::io
