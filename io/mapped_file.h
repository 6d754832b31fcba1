// A file mapped into memory: how the local tier (coordinator/local_tier.h)
// writes and reads the files of a node-local step. On a tmpfs (/dev/shm) the
// mapping is the file's own pages: a copy into it is the whole write, and a
// read of it copies nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

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

}  // namespace mhckpt::io
