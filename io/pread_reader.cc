#include "io/pread_reader.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
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
// Direct reads' alignment where the kernel does not say (no STATX_DIOALIGN
// before Linux 6.1): a page is enough for every file system that has
// O_DIRECT.
constexpr uint64_t kDefaultDirectAlign = 4096;
#ifdef __NR_cachestat
constexpr long kSysCachestat = __NR_cachestat;
#else
constexpr long kSysCachestat = 451;  // the same number on every architecture
#endif

// preadv behind the fault seam (point `pread`): EIO, EINTR, or a short read
// (half the bytes asked for, at least one; a multiple of `align`, as a
// short direct read is).
ssize_t SysPreadv(int fd, const iovec* iov, int count, uint64_t offset, size_t align = 1) {
  if (int e = fault::Errno("pread")) return errno = e, -1;
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  size_t allowed = fault::ShortWrite("pread", total);
  if (allowed < total) allowed = std::min(total, std::max(align, allowed / align * align));
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

// The data file opened a second time with O_DIRECT, and the alignment the
// file system asks of a direct read's offset, length and memory. fd -1:
// no direct reads (the file system refuses O_DIRECT, as tmpfs did before
// Linux 6.6).
struct DirectFile {
  int fd = -1;
  uint64_t align = kDefaultDirectAlign;
};

DirectFile OpenDirect(const std::string& path) {
  DirectFile d;
  d.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (d.fd < 0) return {};
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(d.fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) != 0) {
    if (sx.stx_dio_offset_align == 0) {  // this file cannot be read directly
      ::close(d.fd);
      return {};
    }
    d.align = std::max<uint64_t>(sx.stx_dio_mem_align, sx.stx_dio_offset_align);
  }
#endif
  return d;
}

// True when at least half of [offset, offset + size) is in the page cache
// (cachestat, Linux 6.5): a copy out of the cache is faster than the disk.
// False where the kernel cannot tell.
bool MostlyCached(int fd, uint64_t offset, uint64_t size) {
  struct {
    uint64_t off, len;
  } range{offset, size};
  struct {
    uint64_t cache, dirty, writeback, evicted, recently_evicted;
  } stat{};
  if (::syscall(kSysCachestat, fd, &range, &stat, 0) != 0) return false;
  return stat.cache * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) * 2 >= size;
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

// One job of the direct part of a batch: segments [first, last) of its
// list. Either the lined-up middle of one piece, read straight into its
// destination, or (`bounce`) a run of small segments lying close together,
// read as one aligned span into a bounce buffer and copied out.
struct DirectJob {
  size_t first = 0;
  size_t last = 0;
  bool bounce = false;
};

// The direct part of a batch (see the header), read by up to
// kDirectReadThreads threads at once, so that the device always has several
// requests. A read that stops lining up (a short read) is finished through
// `buffered`; a file system that refuses a direct read (EINVAL) has the rest
// read buffered too, and `refused` set.
class DirectReads {
 public:
  DirectReads(const DirectFile& direct, int buffered, const std::string& path,
              const std::vector<Segment>& segs, const std::vector<DirectJob>& jobs,
              std::atomic<bool>& refused)
      : direct_(direct),
        buffered_(buffered),
        path_(path),
        segs_(segs),
        jobs_(jobs),
        refused_(refused) {
    const size_t n = std::min(kDirectReadThreads, jobs.size());
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Run(); });
  }
  DirectReads(const DirectReads&) = delete;
  DirectReads& operator=(const DirectReads&) = delete;
  ~DirectReads() {  // the batch failed elsewhere: no new jobs
    stop_.store(true);
    Stop();
  }

  /// Waits for the threads; returns the first failure and the index (in
  /// `segs`) of the first segment of its job, or OK.
  Status Finish(size_t* failed) {
    Stop();
    *failed = failed_;
    return status_;
  }

 private:
  void Stop() {
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  void Run() {
    std::unique_ptr<std::byte, decltype(&std::free)> bounce(nullptr, &std::free);
    for (;;) {
      const size_t i = next_.fetch_add(1);
      if (i >= jobs_.size() || stop_.load()) return;
      const DirectJob& job = jobs_[i];
      Status s;
      if (!job.bounce) {
        const Segment& seg = segs_[job.first];
        s = ReadSpan(seg.offset, seg.offset + seg.size, seg.offset + seg.size, seg.dst);
      } else {
        if (!bounce) {
          bounce.reset(static_cast<std::byte*>(
              std::aligned_alloc(kBounceAlign, kBounceReadBytes + 2 * kBounceAlign)));
        }
        s = ReadBounced(job, bounce.get());
      }
      if (!s.ok()) {
        const std::lock_guard<std::mutex> lock(mu_);
        if (status_.ok()) status_ = std::move(s), failed_ = job.first;
        stop_.store(true);
        return;
      }
    }
  }

  // The segments of `job` (sorted, disjoint): the span from the aligned
  // block before the first to the one after the last, read directly into
  // `bounce`, then copied out. Without a direct descriptor the span is read
  // buffered, from its first byte.
  Status ReadBounced(const DirectJob& job, std::byte* bounce) {
    const uint64_t begin = segs_[job.first].offset;
    const uint64_t end = segs_[job.last - 1].offset + segs_[job.last - 1].size;
    const uint64_t from = begin / direct_.align * direct_.align;
    const uint64_t to = (end + direct_.align - 1) / direct_.align * direct_.align;
    MHCKPT_RETURN_IF_ERROR(ReadSpan(from, to, end, bounce));
    for (size_t i = job.first; i < job.last; ++i) {
      std::memcpy(segs_[i].dst, bounce + (segs_[i].offset - from), segs_[i].size);
    }
    return OkStatus();
  }

  // Reads file bytes [from, needed) into `dst`, asking for [from, to) while
  // the reads are direct (the position and the rest line up: an aligned span
  // may end past the end of the file), else for [from, needed) through the
  // page cache.
  Status ReadSpan(uint64_t from, uint64_t to, uint64_t needed, std::byte* dst) {
    uint64_t done = 0;
    while (from + done < needed) {
      const uint64_t offset = from + done;
      const bool direct =
          !refused_.load() && offset % direct_.align == 0 && (to - offset) % direct_.align == 0;
      const iovec v{dst + done, static_cast<size_t>((direct ? to : needed) - offset)};
      const ssize_t n =
          SysPreadv(direct ? direct_.fd : buffered_, &v, 1, offset, direct ? direct_.align : 1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct) {
        refused_.store(true);  // this file system reads no more directly
        continue;
      }
      if (n < 0) {
        return IoError(fmt::format("pread '{}' at byte {}{}: {}", path_, offset,
                                   direct ? " (O_DIRECT)" : "", std::strerror(errno)));
      }
      if (n == 0) {
        return DataLoss(fmt::format("'{}' ends before byte {} (truncated?)", path_, offset));
      }
      if (direct) CountDirectRead(static_cast<uint64_t>(n));
      done += static_cast<uint64_t>(n);
    }
    return OkStatus();
  }

  static constexpr size_t kBounceAlign = 4096;  // a page: enough for every file system

  const DirectFile& direct_;
  int buffered_;
  const std::string& path_;
  const std::vector<Segment>& segs_;
  const std::vector<DirectJob>& jobs_;
  std::atomic<bool>& refused_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  Status status_;
  size_t failed_ = 0;
  std::vector<std::thread> threads_;  // last: they start with the members above set
};

class PreadReader final : public StepReader {
 public:
  PreadReader(int fd, DirectFile direct, Status opened, std::string path, int64_t step,
              std::unique_ptr<StepReader> metadata, bool prefault)
      : fd_(fd),
        direct_(direct),
        opened_(std::move(opened)),
        path_(std::move(path)),
        step_(step),
        metadata_(std::move(metadata)),
        prefault_(prefault) {}
  PreadReader(const PreadReader&) = delete;
  PreadReader& operator=(const PreadReader&) = delete;
  ~PreadReader() override {
    if (fd_ >= 0) ::close(fd_);
    if (direct_.fd >= 0) ::close(direct_.fd);
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
    if (direct_.fd >= 0) ::close(direct_.fd);
    fd_ = direct_.fd = -1;
    return metadata_ ? metadata_->Close() : OkStatus();
  }

 private:
  struct Array {
    std::string name;
    Placement placement;
  };

  std::vector<Segment> Segments(std::span<const ReadRequest> requests) const;
  void TakeDirect(std::vector<Segment>& segs, std::vector<Segment>& segs_out,
                  std::vector<DirectJob>& jobs) const;
  Status ReadJoined(const std::vector<Segment>& segs, const Joined& j);
  Status Fail(const ReadRequest& r, const Status& cause) const;

  int fd_;
  DirectFile direct_;
  std::atomic<bool> direct_refused_{false};
  bool readahead_ = true;  // fd_ is advised SEQUENTIAL (else RANDOM)
  Status opened_;          // of fd_: an error here is returned by every read
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

// Moves the parts of `segs` that can be read directly into `segs_out`,
// as the jobs of `jobs` (see the header), unless the page cache holds most
// of them: of each segment at least kDirectReadMinBytes long whose
// destination lines up with its file offset (equal modulo the alignment),
// its aligned middle; then runs of shorter segments close together (gaps of
// at most kJoinGapBytes) that span at least kDirectReadMinBytes and at most
// kBounceReadBytes, to be read through a bounce buffer. What is left stays
// in `segs`, in order.
void PreadReader::TakeDirect(std::vector<Segment>& segs, std::vector<Segment>& segs_out,
                             std::vector<DirectJob>& jobs) const {
  if (direct_.fd < 0 || direct_refused_.load()) return;
  const uint64_t a = direct_.align;
  std::vector<Segment> rest;
  for (const Segment& s : segs) {
    const uint64_t head = (a - s.offset % a) % a;
    const uint64_t middle = s.size > head ? (s.size - head) / a * a : 0;
    const bool lined_up = (reinterpret_cast<uintptr_t>(s.dst) + head) % a == 0;
    if (!lined_up || middle < kDirectReadMinBytes || MostlyCached(fd_, s.offset + head, middle)) {
      rest.push_back(s);
      continue;
    }
    if (head > 0) rest.push_back({s.offset, static_cast<size_t>(head), s.dst, s.request});
    jobs.push_back({segs_out.size(), segs_out.size() + 1, false});
    segs_out.push_back({s.offset + head, static_cast<size_t>(middle), s.dst + head, s.request});
    if (const uint64_t tail = s.size - head - middle; tail > 0) {
      rest.push_back(
          {s.offset + head + middle, static_cast<size_t>(tail), s.dst + head + middle, s.request});
    }
  }
  segs.clear();
  auto small = [](const Segment& s) { return s.size < kDirectReadMinBytes; };
  for (size_t i = 0; i < rest.size();) {
    size_t j = i + 1;
    uint64_t end = rest[i].offset + rest[i].size;
    while (small(rest[i]) && j < rest.size() && small(rest[j]) && rest[j].offset >= end &&
           rest[j].offset - end <= kJoinGapBytes &&
           rest[j].offset + rest[j].size - rest[i].offset <= kBounceReadBytes) {
      end = rest[j].offset + rest[j].size;
      ++j;
    }
    const uint64_t span = end - rest[i].offset;
    const bool bounce =
        small(rest[i]) && span >= kDirectReadMinBytes && !MostlyCached(fd_, rest[i].offset, span);
    auto& to = bounce ? segs_out : segs;
    if (bounce) jobs.push_back({segs_out.size(), segs_out.size() + (j - i), true});
    to.insert(to.end(), rest.begin() + static_cast<ptrdiff_t>(i),
              rest.begin() + static_cast<ptrdiff_t>(j));
    i = j;
  }
}

Status PreadReader::ReadMany(std::span<const ReadRequest> requests) {
  std::vector<Segment> segs = Segments(requests);
  MHCKPT_RETURN_IF_ERROR(opened_);
  std::vector<Segment> direct;
  std::vector<DirectJob> jobs;
  TakeDirect(segs, direct, jobs);
  const std::vector<Joined> joined = Join(segs);
  uint64_t bytes = 0;
  for (const Segment& s : segs) bytes += s.size;
  // Beside direct reads, the buffered ones are heads, tails and small
  // arrays, all announced below: the kernel's own read-ahead would only
  // fetch into the cache the bytes the direct reads fetch again.
  if (const bool want = direct.empty(); want != readahead_) {
    (void)::posix_fadvise(fd_, 0, 0, want ? POSIX_FADV_SEQUENTIAL : POSIX_FADV_RANDOM);
    readahead_ = want;
  }
  std::optional<DirectReads> reads;  // joined before `direct` and `jobs` go
  if (!jobs.empty()) reads.emplace(direct_, fd_, path_, direct, jobs, direct_refused_);
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
  if (reads) {
    size_t failed = 0;
    Status s = reads->Finish(&failed);
    if (!s.ok()) return Fail(requests[direct[failed].request], s);
  }
  CountOffsetReads(requests.size(), joined.size() + jobs.size());
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
                                                    const ReadOptions& options) {
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
  const DirectFile direct = fd >= 0 && options.direct ? OpenDirect(path) : DirectFile{};
  return std::unique_ptr<StepReader>(std::make_unique<PreadReader>(
      fd, direct, std::move(opened), path, step, std::move(metadata), options.prefault));
}

}  // namespace mhckpt::io
