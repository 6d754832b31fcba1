// Array bytes written straight into a file at known offsets with pwrite, from
// a small pool of threads: the data path of the direct engine
// (io/direct_engine.h). Nothing here knows HDF5; it writes byte runs where it
// is told to and makes them durable with one fsync.
//
// Runs that touch in the file (one ends where the next begins: the small
// arrays HDF5 packs side by side) are joined into one piece and written as
// one run; a piece is at most kRawChunkBytes, cut at page boundaries.
//
// O_DIRECT where the file system accepts it: the page-aligned middle of a
// piece goes through an O_DIRECT descriptor (from the caller's memory when the
// piece is one aligned run, else gathered into a per-thread aligned bounce
// buffer); the unaligned head and tail, and pieces too small to be worth a
// synchronous device write, go through an ordinary buffered descriptor. A
// page is therefore written either only directly or only through the page
// cache, never both, so a buffered read-modify-write of a shared page can
// never put stale bytes over a direct write. Where the file system refuses
// O_DIRECT (EINVAL on open or on the first direct write: tmpfs, some FUSE and
// network file systems) every byte goes through the buffered descriptor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace mhckpt::io {

/// Alignment of direct writes (file offset, length and memory): a page, which
/// also covers the logical block size of the disks in use.
inline constexpr size_t kDirectAlign = 4096;
/// Pieces shorter than this go through the page cache even with O_DIRECT on:
/// a direct write waits for the device, which costs more than a copy for them.
inline constexpr size_t kMinDirectBytes = 256 << 10;
/// Bytes one thread writes at a time; also the size of its bounce buffer.
inline constexpr size_t kRawChunkBytes = 8 << 20;

/// One contiguous run of bytes to write: `size` bytes from `src` at `offset`.
struct RawRun {
  uint64_t offset = 0;
  const std::byte* src = nullptr;
  size_t size = 0;
};

/// One open file being written. Thread-safe: the pool's threads write runs
/// concurrently (they never overlap).
class RawFile {
 public:
  RawFile() = default;
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  ~RawFile();  ///< closes without syncing (an error path)

  /// Opens the existing file `path` for writing; with `direct`, also an
  /// O_DIRECT descriptor where the file system allows one. IoError.
  Status Open(const std::string& path, bool direct);
  /// Writes `run`, using `bounce` (kRawChunkBytes, kDirectAlign-aligned, or
  /// null: then unaligned memory goes through the page cache) to align
  /// memory for a direct write. IoError naming the file and the offset.
  Status Write(const RawRun& run, std::byte* bounce);
  /// Writes `piece`: runs that follow each other in the file without a gap,
  /// at most kRawChunkBytes in all, as one run (its direct middle gathered
  /// into `bounce`; without one, through the page cache).
  Status WritePiece(std::span<const RawRun> piece, std::byte* bounce);
  /// fsyncs the file (every descriptor's writes: fsync is per file) and
  /// closes it. IoError.
  Status SyncAndClose();
  /// True while direct writes are in use (false after a fallback).
  [[nodiscard]] bool direct() const { return direct_fd_.load() >= 0; }
  /// Bytes written through the O_DIRECT descriptor so far.
  [[nodiscard]] uint64_t direct_bytes() const { return direct_bytes_.load(); }

 private:
  Status WriteBuffered(uint64_t offset, const std::byte* src, size_t size);
  // The aligned middle of a run; falls back to buffered writes on EINVAL.
  Status WriteDirect(uint64_t offset, const std::byte* src, size_t size, std::byte* bounce);
  Status DirectOnce(uint64_t offset, const std::byte* src, size_t size, bool* refused);
  void Close();

  std::string path_;
  int fd_ = -1;
  std::atomic<int> direct_fd_{-1};
  std::atomic<uint64_t> direct_bytes_{0};
  std::mutex fallback_mu_;
  int retired_direct_fd_ = -1;  // closed with the file, not while a thread may use it
};

/// Threads that run write jobs, with one bounce buffer each, kept between
/// steps (the engine owns it). Submit and Wait are called from one thread.
class RawWriterPool {
 public:
  explicit RawWriterPool(int threads);
  ~RawWriterPool();
  RawWriterPool(const RawWriterPool&) = delete;
  RawWriterPool& operator=(const RawWriterPool&) = delete;

  /// Queues `runs` (their memory must stay valid until Wait returns; in any
  /// order, never overlapping) to be written into `file`: runs that touch in
  /// the file are joined, and the result cut into pieces of at most
  /// kRawChunkBytes spread over the threads.
  void Submit(RawFile* file, std::vector<RawRun> runs);
  /// Waits for every submitted run; the first error since the last Wait.
  Status Wait();
  [[nodiscard]] int threads() const { return static_cast<int>(threads_.size()); }

 private:
  // Pieces (RawFile::WritePiece) one thread writes one after another: the
  // runs of piece i are runs[ends[i-1], ends[i]).
  struct Job {
    RawFile* file = nullptr;
    std::vector<RawRun> runs;
    std::vector<size_t> ends;
    size_t bytes = 0;
  };
  void Loop(size_t worker);
  void Push(Job* job);

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> jobs_;
  size_t running_ = 0;
  bool stop_ = false;
  Status first_error_;
  std::vector<std::byte*> bounce_;    // one per thread, allocated on first direct use
  std::vector<std::thread> threads_;  // last: started after the fields above exist
};

}  // namespace mhckpt::io
