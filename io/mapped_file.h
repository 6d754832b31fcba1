// A file mapped into memory: how the local tier (coordinator/local_tier.h)
// writes and reads the files of a node-local step. On a tmpfs (/dev/shm) the
// mapping is the file's own pages: a copy into it is the whole write, and a
// read of it copies nothing.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace mhckpt::io {

class MappedFile {
 public:
  /// Creates `path` (or reuses it, keeping the pages it has) with exactly
  /// `bytes` bytes, all reserved on the file system (posix_fallocate: a full
  /// tmpfs fails here with IoError, not later with SIGBUS on a write into
  /// the mapping), mapped for writing. The contents are unspecified: the
  /// caller writes every byte.
  static Result<MappedFile> Create(const std::string& path, uint64_t bytes);
  /// One piece of a file written by CreateByWrites.
  struct Piece {
    uint64_t offset = 0;
    const std::byte* data = nullptr;
    uint64_t size = 0;
  };
  /// Creates `path` (or reuses it, keeping its pages), sets its size to
  /// `bytes`, writes `pieces` into it with pwrite (a full file system is
  /// IoError naming ENOSPC), and maps it for reading: one copy of each byte.
  /// The pieces must cover the whole file.
  static Result<MappedFile> CreateByWrites(const std::string& path, uint64_t bytes,
                                           std::span<const Piece> pieces);
  /// Maps `path` for reading. NotFound if it does not exist.
  static Result<MappedFile> OpenForReading(const std::string& path);
  /// The size of `path` in bytes, or NotFound / IoError.
  static Result<uint64_t> Size(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] uint64_t size() const { return size_; }
  [[nodiscard]] const std::string& path() const { return path_; }

  /// Unmaps and closes; IoError if the file could not be closed.
  Status Close();

 private:
  std::string path_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// Writable mappings of files that come back: how the local tier
// (coordinator/local_tier.h) avoids mapping the same tmpfs file again at
// every save. A step's files are recycled (a dropped step's directory comes
// back as the next step's, and a rank's landing file trades places with its
// writer file), so the files a save writes are, in the steady state, the
// same few inodes going round. Mapping a file (MAP_POPULATE) and unmapping
// it walk a page-table entry per 4 KiB page, 262,144 per GiB; a kept
// mapping of the same inode does neither.
//
// A mapping is kept per file (its device and inode, with an open
// descriptor, so the inode number cannot be reused while it is kept) and
// found again by the inode the path names now. A file that was deleted
// keeps its pages while mapped: Map and ForgetDeleted let such mappings go
// (a holder's shared_ptr keeps one alive until it is done). At most `keep`
// mappings are kept; the oldest goes first.
class KeptMappings {
 public:
  /// One file mapped for reading and writing; unmapped when the last
  /// holder (the list or a caller) lets go.
  struct Mapping {
    Mapping(int f, dev_t d, ino_t i, std::byte* p, size_t n)
        : fd(f), dev(d), ino(i), data(p), size(n) {}
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    /// True once the file has no name left (or cannot be checked).
    [[nodiscard]] bool Deleted() const;
    const int fd;
    const dev_t dev;
    const ino_t ino;
    std::byte* const data;
    const size_t size;
  };

  /// How Map treats a file it has no kept mapping of.
  enum class Mode {
    kCreate,    // create the file if missing; size, reserve and map it
    kWarmOnly,  // NotFound unless a mapping of the file at `bytes` is kept
  };

  explicit KeptMappings(size_t keep) : keep_(keep) {}

  /// `path` mapped for writing, exactly `bytes` long, every byte reserved
  /// on the file system (posix_fallocate: a full tmpfs is IoError here, not
  /// SIGBUS on a write into the mapping). The kept mapping of the same
  /// file, if its size is `bytes`; else (per `mode`) a new one, which is
  /// kept. The contents are the file's: the caller overwrites them.
  /// `created` (optional) says whether the file was created here.
  Result<std::shared_ptr<Mapping>> Map(const std::string& path, uint64_t bytes, Mode mode,
                                       bool* created = nullptr);

  /// Lets go of the mappings of deleted files (their pages are freed once
  /// no caller holds them).
  void ForgetDeleted();

  /// How many mappings are kept (for tests).
  [[nodiscard]] size_t size() const;

 private:
  const size_t keep_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Mapping>> maps_;  // oldest first
};

}  // namespace mhckpt::io
