#include "io/pread_reader.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/box_runs.h"
#include "io/pread_batch.h"
#include "io/read_counters.h"

namespace mhckpt::io {
namespace {

// The parts of a batch (io/pread_batch.h).
using pread_internal::Announce;
using pread_internal::Completions;
using pread_internal::DirectFile;
using pread_internal::DirectJob;
using pread_internal::DirectReads;
using pread_internal::Join;
using pread_internal::Joined;
using pread_internal::kMaxPieces;
using pread_internal::MostlyCached;
using pread_internal::OpenDirect;
using pread_internal::ReadAhead;
using pread_internal::Segment;
using pread_internal::SysPreadv;

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
    const ReadRequest r{array, box, data, nullptr};
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
// its aligned middle; each other segment that long whole, in spans of at
// most kBounceReadBytes read through a bounce buffer; then runs of shorter
// segments close together (gaps of at most kJoinGapBytes) that span at
// least kDirectReadMinBytes and at most kBounceReadBytes, through a bounce
// buffer too. What is left stays in `segs`, in order.
void PreadReader::TakeDirect(std::vector<Segment>& segs, std::vector<Segment>& segs_out,
                             std::vector<DirectJob>& jobs) const {
  if (direct_.fd < 0 || direct_refused_.load()) return;
  const uint64_t a = direct_.align;
  std::vector<Segment> rest;
  for (const Segment& s : segs) {
    const uint64_t head = (a - s.offset % a) % a;
    const uint64_t middle = s.size > head ? (s.size - head) / a * a : 0;
    const bool lined_up = (reinterpret_cast<uintptr_t>(s.dst) + head) % a == 0;
    if (middle < kDirectReadMinBytes || MostlyCached(fd_, s.offset + head, middle)) {
      rest.push_back(s);
      continue;
    }
    if (!lined_up) {
      // Through the bounce buffers, in spans that end on aligned offsets.
      for (uint64_t at = 0; at < s.size;) {
        const uint64_t from = s.offset + at;
        const uint64_t end = std::min<uint64_t>(
            s.offset + s.size, std::max((from + kBounceReadBytes) / a * a, from + 1));
        jobs.push_back({segs_out.size(), segs_out.size() + 1, true});
        segs_out.push_back({from, static_cast<size_t>(end - from), s.dst + at, s.request});
        at = end - s.offset;
      }
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
  Completions done(requests, segs, direct);  // outlives the threads that report to it
  std::optional<DirectReads> reads;          // joined before `direct` and `jobs` go
  if (!jobs.empty()) reads.emplace(direct_, fd_, path_, direct, jobs, direct_refused_, done);
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
    done.Read(segs, joined[k].first, joined[k].last);
  }
  if (reads) {
    size_t failed = 0;
    Status s = reads->Finish(&failed);
    if (!s.ok()) return Fail(requests[direct[failed].request], s);
  }
  CountOffsetReads(requests.size(), joined.size() + jobs.size());
  return done.Finish();
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
