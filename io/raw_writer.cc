#include "io/raw_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "base/fault.h"

namespace mhckpt::io {
namespace {

uint64_t AlignUp(uint64_t x) { return (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }
uint64_t AlignDown(uint64_t x) { return x / kDirectAlign * kDirectAlign; }

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0; }

Status WriteError(const std::string& path, uint64_t offset, size_t size, int e) {
  return IoError(
      fmt::format("write {} bytes at offset {} of '{}': {}", size, offset, path, std::strerror(e)));
}

// Calls fn(offset, src, size) for the part of each run of `piece` that lies
// in [from, to) of the file, in order; stops at the first error.
template <typename Fn>
Status ForEachPart(std::span<const RawRun> piece, uint64_t from, uint64_t to, Fn&& fn) {
  for (const RawRun& r : piece) {
    const uint64_t b = std::max(from, r.offset);
    const uint64_t e = std::min(to, r.offset + r.size);
    if (b < e) MHCKPT_RETURN_IF_ERROR(fn(b, r.src + (b - r.offset), static_cast<size_t>(e - b)));
  }
  return OkStatus();
}

}  // namespace

// ---- RawFile ----

RawFile::~RawFile() { Close(); }

void RawFile::Close() {
  for (int* fd : {&fd_, &retired_direct_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  int d = direct_fd_.exchange(-1);
  if (d >= 0) ::close(d);
}

Status RawFile::Open(const std::string& path, bool direct) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) {
    return IoError(fmt::format("open '{}' for writing: {}", path, std::strerror(errno)));
  }
  if (direct) {
    // EINVAL: the file system has no O_DIRECT; every write is buffered then.
    int d = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
    if (d < 0 && errno != EINVAL) {
      return IoError(fmt::format("open '{}' with O_DIRECT: {}", path, std::strerror(errno)));
    }
    direct_fd_.store(d);
  }
  return OkStatus();
}

Status RawFile::WriteBuffered(uint64_t offset, const std::byte* src, size_t size) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, src, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return WriteError(path_, offset, size, n < 0 ? errno : ENOSPC);
    offset += static_cast<uint64_t>(n);
    src += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

// Writes aligned `size` bytes from aligned `src` through the O_DIRECT
// descriptor. Sets `refused` when the file system rejects O_DIRECT (EINVAL);
// the caller then writes the whole piece again through the page cache.
Status RawFile::DirectOnce(uint64_t offset, const std::byte* src, size_t size, bool* refused) {
  const int d = direct_fd_.load();
  if (d < 0) {
    *refused = true;
    return OkStatus();
  }
  while (size > 0) {
    ssize_t n = ::pwrite(d, src, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL) {
      *refused = true;
      return OkStatus();
    }
    if (n <= 0) return WriteError(path_, offset, size, n < 0 ? errno : ENOSPC);
    direct_bytes_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    offset += static_cast<uint64_t>(n);
    src += n;
    size -= static_cast<size_t>(n);
    // A short write that ends off a page: the rest goes through the page cache.
    if (size > 0 && n % static_cast<ssize_t>(kDirectAlign) != 0) {
      return WriteBuffered(offset, src, size);
    }
  }
  return OkStatus();
}

Status RawFile::WriteDirect(uint64_t offset, const std::byte* src, size_t size, std::byte* bounce) {
  while (size > 0) {
    const size_t piece = Aligned(src) ? size : std::min(size, kRawChunkBytes);
    const std::byte* from = src;
    if (!Aligned(src)) {
      if (bounce == nullptr) return WriteBuffered(offset, src, size);
      std::memcpy(bounce, src, piece);
      from = bounce;
    }
    bool refused = false;
    MHCKPT_RETURN_IF_ERROR(DirectOnce(offset, from, piece, &refused));
    if (refused) {
      // Stop using O_DIRECT for this file; the descriptor is closed with it.
      int d = direct_fd_.exchange(-1);
      if (d >= 0) {
        std::lock_guard<std::mutex> lock(fallback_mu_);
        retired_direct_fd_ = d;
      }
      return WriteBuffered(offset, src, size);
    }
    offset += piece;
    src += piece;
    size -= piece;
  }
  return OkStatus();
}

Status RawFile::Write(const RawRun& run, std::byte* bounce) {
  const uint64_t end = run.offset + run.size;
  const uint64_t a = AlignUp(run.offset), b = AlignDown(end);
  if (direct_fd_.load() < 0 || run.size < kMinDirectBytes || b <= a) {
    return WriteBuffered(run.offset, run.src, run.size);
  }
  // Head and tail share pages with other runs or metadata: page cache.
  MHCKPT_RETURN_IF_ERROR(WriteBuffered(run.offset, run.src, a - run.offset));
  MHCKPT_RETURN_IF_ERROR(WriteDirect(a, run.src + (a - run.offset), b - a, bounce));
  return WriteBuffered(b, run.src + (b - run.offset), end - b);
}

Status RawFile::WritePiece(std::span<const RawRun> piece, std::byte* bounce) {
  if (piece.size() == 1) return Write(piece.front(), bounce);
  const uint64_t begin = piece.front().offset;
  const uint64_t end = piece.back().offset + piece.back().size;
  const uint64_t a = AlignUp(begin), b = AlignDown(end);
  auto buffered = [this](uint64_t offset, const std::byte* src, size_t size) {
    return WriteBuffered(offset, src, size);
  };
  if (direct_fd_.load() < 0 || bounce == nullptr || end - begin < kMinDirectBytes || b <= a) {
    return ForEachPart(piece, begin, end, buffered);
  }
  // Every page of [a, b) holds bytes of this piece alone (the runs touch):
  // gathered into the bounce buffer (b - a <= kRawChunkBytes), one direct
  // write. The pages of the head and tail may hold metadata or another run.
  MHCKPT_RETURN_IF_ERROR(ForEachPart(piece, begin, a, buffered));
  std::byte* to = bounce;
  ForEachPart(piece, a, b, [&to](uint64_t, const std::byte* src, size_t size) {
    std::memcpy(to, src, size);
    to += size;
    return OkStatus();
  }).IgnoreError();
  MHCKPT_RETURN_IF_ERROR(WriteDirect(a, bounce, b - a, nullptr));
  return ForEachPart(piece, b, end, buffered);
}

Status RawFile::SyncAndClose() {
  Status s;
  // The data file's fsync behind the fault seam, as the HDF5 engine's flush.
  if (int e = fault::Errno("data_fsync"); fd_ >= 0 && e != 0) {
    s = IoError(fmt::format("flush '{}': {} (injected at data_fsync)", path_, std::strerror(e)));
  } else if (fd_ >= 0 && ::fsync(fd_) != 0) {
    s = IoError(fmt::format("fsync '{}': {}", path_, std::strerror(errno)));
  }
  Close();
  return s;
}

// ---- RawWriterPool ----

RawWriterPool::RawWriterPool(int threads) {
  const size_t n = static_cast<size_t>(std::max(threads, 1));
  bounce_.assign(n, nullptr);
  for (size_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { Loop(i); });
}

RawWriterPool::~RawWriterPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (std::byte* b : bounce_) std::free(b);
}

// Queues `job` and leaves it empty, for the same file.
void RawWriterPool::Push(Job* job) {
  if (job->ends.empty()) return;
  RawFile* file = job->file;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(*job));
  }
  work_cv_.notify_one();
  *job = Job{};
  job->file = file;
}

void RawWriterPool::Submit(RawFile* file, std::vector<RawRun> runs) {
  // Runs that touch in the file make one piece, which is cut at the first
  // page boundary kRawChunkBytes past its start: small arrays laid side by
  // side are written together, and a long run is cut into pieces that the
  // threads write side by side. Pieces travel in jobs of about a chunk.
  std::sort(runs.begin(), runs.end(),
            [](const RawRun& x, const RawRun& y) { return x.offset < y.offset; });
  Job job;
  job.file = file;
  bool open = false;  // a piece is being built: from piece_begin to piece_end
  uint64_t piece_begin = 0, piece_end = 0;
  auto close_piece = [&] {
    if (!open) return;
    open = false;
    job.ends.push_back(job.runs.size());
    if (job.bytes >= kRawChunkBytes) Push(&job);
  };
  for (const RawRun& r : runs) {
    const uint64_t end = r.offset + r.size;
    if (open && r.offset != piece_end) close_piece();
    for (uint64_t off = r.offset; off < end;) {
      if (!open) {
        open = true;
        piece_begin = off;
      }
      const uint64_t limit = AlignDown(piece_begin + kRawChunkBytes);
      const uint64_t cut = std::min(end, limit);
      job.runs.push_back({off, r.src + (off - r.offset), static_cast<size_t>(cut - off)});
      job.bytes += cut - off;
      off = piece_end = cut;
      if (cut == limit) close_piece();
    }
  }
  close_piece();
  Push(&job);
}

Status RawWriterPool::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return jobs_.empty() && running_ == 0; });
  Status s = first_error_;
  first_error_ = OkStatus();
  return s;
}

void RawWriterPool::Loop(size_t worker) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop_
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    const bool skip = !first_error_.ok();  // after an error the rest is not written
    lock.unlock();
    Status s;
    if (!skip) {
      std::byte*& bounce = bounce_[worker];  // only this thread touches it
      if (bounce == nullptr && job.file->direct()) {
        bounce = static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, kRawChunkBytes));
      }
      const std::span<const RawRun> runs(job.runs);
      for (size_t p = 0, first = 0; s.ok() && p < job.ends.size(); first = job.ends[p++]) {
        s = job.file->WritePiece(runs.subspan(first, job.ends[p] - first), bounce);
      }
    }
    lock.lock();
    --running_;
    if (first_error_.ok() && !s.ok()) first_error_ = s;
    if (jobs_.empty() && running_ == 0) done_cv_.notify_all();
  }
}

}  // namespace mhckpt::io
