#include "io/pread_batch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/pages.h"
#include "io/pread_reader.h"
#include "io/read_counters.h"

namespace mhckpt::io::pread_internal {
namespace {

// Bytes announced (POSIX_FADV_WILLNEED) ahead of the read being made.
constexpr uint64_t kWillNeedBytes = uint64_t{64} << 20;
#ifdef __NR_cachestat
constexpr long kSysCachestat = __NR_cachestat;
#else
constexpr long kSysCachestat = 451;  // the same number on every architecture
#endif

}  // namespace

ssize_t SysPreadv(int fd, const iovec* iov, int count, uint64_t offset, size_t align) {
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

Completions::Completions(std::span<const ReadRequest> requests,
                         const std::vector<Segment>& buffered, const std::vector<Segment>& direct)
    : requests_(requests) {
  if (std::none_of(requests.begin(), requests.end(),
                   [](const ReadRequest& r) { return static_cast<bool>(r.on_read); })) {
    return;
  }
  left_ = std::make_unique<std::atomic<uint32_t>[]>(requests.size());
  errors_.resize(requests.size());
  for (const std::vector<Segment>* segs : {&buffered, &direct}) {
    for (const Segment& s : *segs) left_[s.request].fetch_add(1, std::memory_order_relaxed);
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    if (left_[r].load(std::memory_order_relaxed) == 0) empty_.push_back(r);
  }
}

void Completions::Read(const std::vector<Segment>& segs, size_t first, size_t last) {
  if (!left_) return;
  for (size_t i = first; i < last; ++i) {
    const size_t r = segs[i].request;
    // acq_rel: the thread that runs on_read sees every other thread's bytes.
    if (left_[r].fetch_sub(1, std::memory_order_acq_rel) == 1) Run(r);
  }
}

void Completions::Run(size_t request) {
  if (requests_[request].on_read) errors_[request] = requests_[request].on_read();
}

Status Completions::Finish() {
  if (!left_) return OkStatus();
  for (size_t r : empty_) Run(r);
  for (const Status& e : errors_) {
    if (!e.ok()) return e;
  }
  return OkStatus();
}

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

size_t Announce(int fd, const std::vector<Joined>& joined, size_t from, size_t reading) {
  for (; from < joined.size(); ++from) {
    const Joined& n = joined[from];
    if (from > reading && n.begin - joined[reading].begin >= kWillNeedBytes) break;
    (void)::posix_fadvise(fd, static_cast<off_t>(n.begin), static_cast<off_t>(n.end - n.begin),
                          POSIX_FADV_WILLNEED);
  }
  return from;
}

ReadAhead::~ReadAhead() {
  reading_.store(kStopped);
  reading_.notify_one();
  thread_.join();
}

void ReadAhead::Run() {
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
      // Any refusal ends the prefaulting: the reads fault the pages themselves.
      prefault = PopulateWholePages(segs_[i].dst, segs_[i].size);
    }
    ++next;
  }
}

DirectReads::DirectReads(const DirectFile& direct, int buffered, const std::string& path,
                         const std::vector<Segment>& segs, const std::vector<DirectJob>& jobs,
                         std::atomic<bool>& refused, Completions& done)
    : direct_(direct),
      buffered_(buffered),
      path_(path),
      segs_(segs),
      jobs_(jobs),
      refused_(refused),
      done_(done) {
  const size_t n = std::min(kDirectReadThreads, jobs.size());
  for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Run(); });
}

DirectReads::~DirectReads() {
  stop_.store(true);
  Stop();
}

Status DirectReads::Finish(size_t* failed) {
  Stop();
  *failed = failed_;
  return status_;
}

void DirectReads::Stop() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void DirectReads::Run() {
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
    done_.Read(segs_, job.first, job.last);
  }
}

Status DirectReads::ReadBounced(const DirectJob& job, std::byte* bounce) {
  const uint64_t begin = segs_[job.first].offset;
  const uint64_t end = segs_[job.last - 1].offset + segs_[job.last - 1].size;
  const uint64_t from = begin / direct_.align * direct_.align;
  const uint64_t to = (end + direct_.align - 1) / direct_.align * direct_.align;
  uint64_t direct = 0;
  MHCKPT_RETURN_IF_ERROR(ReadSpan(from, to, end, bounce, &direct));
  uint64_t wanted = 0;
  for (size_t i = job.first; i < job.last; ++i) {
    std::memcpy(segs_[i].dst, bounce + (segs_[i].offset - from), segs_[i].size);
    wanted += segs_[i].size;
  }
  // The bytes asked for, not the span's alignment and gaps.
  CountDirectRead(std::min(wanted, direct));
  return OkStatus();
}

Status DirectReads::ReadSpan(uint64_t from, uint64_t to, uint64_t needed, std::byte* dst,
                             uint64_t* direct_bytes) {
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
    if (direct && direct_bytes == nullptr) CountDirectRead(static_cast<uint64_t>(n));
    if (direct && direct_bytes != nullptr) *direct_bytes += static_cast<uint64_t>(n);
    done += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

}  // namespace mhckpt::io::pread_internal
