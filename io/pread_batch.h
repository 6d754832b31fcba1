// The parts of a batch of reads by offset (io/pread_reader.h, which
// describes them): its boxes cut into segments and joined into requests,
// the read-ahead thread that announces the requests and prefaults their
// destinations, and the threads of its direct reads. Internal to
// io/pread_reader.cc and io/pread_batch.cc.
#pragma once

#include <limits.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "io/storage.h"

namespace mhckpt::io::pread_internal {

// Pieces of one joined request, the gaps' included.
constexpr size_t kMaxPieces = IOV_MAX;
// Direct reads' alignment where the kernel does not say (no STATX_DIOALIGN
// before Linux 6.1): a page is enough for every file system that has
// O_DIRECT.
constexpr uint64_t kDefaultDirectAlign = 4096;

// preadv behind the fault seam (point `pread`): EIO, EINTR, or a short read
// (half the bytes asked for, at least one; a multiple of `align`, as a
// short direct read is).
ssize_t SysPreadv(int fd, const iovec* iov, int count, uint64_t offset, size_t align = 1);

// The data file opened a second time with O_DIRECT, and the alignment the
// file system asks of a direct read's offset, length and memory. fd -1:
// no direct reads (the file system refuses O_DIRECT, as tmpfs did before
// Linux 6.6).
struct DirectFile {
  int fd = -1;
  uint64_t align = kDefaultDirectAlign;
};

DirectFile OpenDirect(const std::string& path);

// True when at least half of [offset, offset + size) is in the page cache
// (cachestat, Linux 6.5): a copy out of the cache is faster than the disk.
// False where the kernel cannot tell.
bool MostlyCached(int fd, uint64_t offset, uint64_t size);

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

// Per request of a batch, the segments of it not yet read: the thread that
// reads the last one runs the request's ReadRequest::on_read there and then.
// Thread-safe: the direct reads' threads and the batch's own report reads.
class Completions {
 public:
  // Counts the segments of each request in `buffered` and `direct` (every
  // segment of the batch, once); none if no request has an on_read.
  Completions(std::span<const ReadRequest> requests, const std::vector<Segment>& buffered,
              const std::vector<Segment>& direct);
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  // Segments [first, last) of `segs` are read.
  void Read(const std::vector<Segment>& segs, size_t first, size_t last);

  // Every read made: runs the on_read of requests with no bytes, and
  // returns the first error of an on_read in the order of the requests.
  Status Finish();

 private:
  void Run(size_t request);

  std::span<const ReadRequest> requests_;
  std::unique_ptr<std::atomic<uint32_t>[]> left_;  // null: no on_read anywhere
  std::vector<Status> errors_;                     // per request, by the thread that ran it
  std::vector<size_t> empty_;                      // requests of no segment
};

// Joins the sorted `segs` into requests (io/pread_reader.h).
std::vector<Joined> Join(const std::vector<Segment>& segs);

// Announces the joined requests `joined[from..]` to the kernel
// (POSIX_FADV_WILLNEED) while they start less than kWillNeedBytes after
// request `reading` (always through `reading` itself). Returns the first
// request not announced.
size_t Announce(int fd, const std::vector<Joined>& joined, size_t from, size_t reading);

// The thread that runs ahead of a batch's reads (io/pread_reader.h): it
// announces the requests to the kernel, then faults in the destination
// pages of the requests after the one being read, and sleeps when it is
// done until the reads move on.
class ReadAhead {
 public:
  ReadAhead(int fd, const std::vector<Segment>& segs, const std::vector<Joined>& joined)
      : fd_(fd), segs_(segs), joined_(joined), thread_([this] { Run(); }) {}
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;
  ~ReadAhead();

  /// The reads have reached joined request `j`.
  void Reading(size_t j) {
    reading_.store(j);
    reading_.notify_one();
  }

 private:
  static constexpr size_t kStopped = SIZE_MAX;

  void Run();

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

// The direct part of a batch (io/pread_reader.h), read by up to
// kDirectReadThreads threads at once, so that the device always has several
// requests; each job read is reported to `done`. A read that stops lining up (a short read) is
// finished through `buffered`; a file system that refuses a direct read (EINVAL) has the rest read
// buffered too, and `refused` set.
class DirectReads {
 public:
  DirectReads(const DirectFile& direct, int buffered, const std::string& path,
              const std::vector<Segment>& segs, const std::vector<DirectJob>& jobs,
              std::atomic<bool>& refused, Completions& done);
  DirectReads(const DirectReads&) = delete;
  DirectReads& operator=(const DirectReads&) = delete;
  ~DirectReads();  ///< the batch failed elsewhere: no new jobs

  /// Waits for the threads; returns the first failure and the index (in
  /// `segs`) of the first segment of its job, or OK.
  Status Finish(size_t* failed);

 private:
  void Stop();
  void Run();

  // The segments of `job` (sorted, disjoint): the span from the aligned
  // block before the first to the one after the last, read directly into
  // `bounce`, then copied out. Without a direct descriptor the span is read
  // buffered, from its first byte.
  Status ReadBounced(const DirectJob& job, std::byte* bounce);

  // Reads file bytes [from, needed) into `dst`, asking for [from, to) while
  // the reads are direct (the position and the rest line up: an aligned span
  // may end past the end of the file), else for [from, needed) through the
  // page cache. Bytes read directly are added to `*direct_bytes`, or, if it
  // is null, counted as read directly (io::Counters).
  Status ReadSpan(uint64_t from, uint64_t to, uint64_t needed, std::byte* dst,
                  uint64_t* direct_bytes = nullptr);

  static constexpr size_t kBounceAlign = 4096;  // a page: enough for every file system

  const DirectFile& direct_;
  int buffered_;
  const std::string& path_;
  const std::vector<Segment>& segs_;
  const std::vector<DirectJob>& jobs_;
  std::atomic<bool>& refused_;
  Completions& done_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  Status status_;
  size_t failed_ = 0;
  std::vector<std::thread> threads_;  // last: they start with the members above set
};

}  // namespace mhckpt::io::pread_internal
