// Small POSIX helpers with errors as Status: durable writes, directory fsync,
// listing and removal. Every system call that can lose data goes through
// here, so that one place decides what "durable" means.
#pragma once

#include <cstdint>
#include <optional>
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
/// `fault_point`: its name at the fault seam (base/fault.h).
Status RemoveAll(const std::string& path, const char* fault_point = "remove");

/// Renames `from` to `to` (rename(2): atomic, same file system; fault point
/// `rename`). Not durable until the parent directories are fsynced.
Status Rename(const std::string& from, const std::string& to);

/// The names of the entries of `dir` (no "." or "..").
Result<std::vector<std::string>> ListDir(const std::string& dir);

/// Allocates the first `bytes` of an existing file on disk (posix_fallocate),
/// so later writes into that range cannot fail for lack of space.
Status Preallocate(const std::string& path, uint64_t bytes);

/// Fsyncs an existing file (fault point `fsync`).
Status FsyncFile(const std::string& path);

/// Unlinks a file; a missing file is not an error.
Status RemoveFile(const std::string& path);

/// Opens (creating it) `path` and takes an exclusive advisory lock on it
/// (flock) without waiting: the descriptor holding the lock, or nullopt if
/// another open file holds it (another process, or another open of it in this
/// one). The kernel releases the lock when the process dies; UnlockFile
/// releases it earlier. Where the file system has no locks (ENOSYS,
/// EOPNOTSUPP, ENOLCK), sets `*unsupported` and returns the descriptor
/// without a lock.
Result<std::optional<int>> TryLockFile(const std::string& path, bool* unsupported);
void UnlockFile(int fd);

/// Replaces `path` with `bytes` by writing `path`.tmp and renaming it, without
/// fsync: a reader sees the old or the new content, a crash may lose both (for
/// small advisory files such as the root's lease, never for data).
Status WriteFileReplacing(const std::string& path, const std::string& bytes);

/// True if `path` exists.
bool PathExists(const std::string& path);

/// Bytes taken by a file or a directory tree (apparent sizes).
uint64_t TreeBytes(const std::string& path);

}  // namespace mhckpt::io
