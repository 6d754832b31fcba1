// Small POSIX helpers with errors as Status: durable writes, directory fsync,
// listing and removal. Every system call that can lose data goes through
// here, so that one place decides what "durable" means.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace mhckpt::io {

/// Writes `bytes` to `path` atomically and durably:
///   1. write `path`.tmp and fsync it;
///   2. rename it over `path`;
///   3. fsync the parent directory, so the rename itself survives a crash.
/// A reader sees the old file, or the whole new one, never a part.
Status WriteFileAtomic(const std::string& path, const std::string& bytes);

/// Reads a whole file of at most `max_bytes`; NotFound if it does not exist.
Result<std::string> ReadSmallFile(const std::string& path, size_t max_bytes);

/// fsyncs a directory (making creations, renames and removals in it durable).
Status FsyncDir(const std::string& dir);

/// mkdir -p.
Status MakeDirs(const std::string& dir);

/// Removes a file or a whole directory tree; a missing path is not an error.
Status RemoveAll(const std::string& path);

/// The names of the entries of `dir` (no "." or "..").
Result<std::vector<std::string>> ListDir(const std::string& dir);

/// Allocates the first `bytes` of an existing file on disk (posix_fallocate),
/// so later writes into that range cannot fail for lack of space.
Status Preallocate(const std::string& path, uint64_t bytes);

/// True if `path` exists.
bool PathExists(const std::string& path);

/// Bytes taken by a file or a directory tree (apparent sizes).
uint64_t TreeBytes(const std::string& path);

}  // namespace mhckpt::io
