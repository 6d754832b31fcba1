#include "io/posix_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "base/fault.h"

namespace mhckpt::io {
namespace {

Status Errno(const std::string& what, const std::string& path, int err) {
  return IoError(fmt::format("{} '{}': {}", what, path, std::strerror(err)));
}

std::string Parent(const std::string& path) {
  std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// The system calls that can lose data, each behind the fault seam
// (base/fault.h) so a test can make it fail with ENOSPC, EIO or EACCES.
ssize_t SysWrite(int fd, const void* data, size_t n) {
  if (int e = fault::Errno("write")) return errno = e, -1;
  return ::write(fd, data, fault::ShortWrite("write", n));
}
ssize_t SysRead(int fd, void* data, size_t n) {
  if (int e = fault::Errno("read")) return errno = e, -1;
  return ::read(fd, data, n);
}
int SysFsync(int fd, const char* point) {
  if (int e = fault::Errno(point)) return errno = e, -1;
  return ::fsync(fd);
}
int SysRename(const char* from, const char* to) {
  if (int e = fault::Errno("rename")) return errno = e, -1;
  return ::rename(from, to);
}
int SysUnlink(const char* path) {
  if (int e = fault::Errno("unlink")) return errno = e, -1;
  return ::unlink(path);
}

// Writes all of `bytes` to `fd`, retrying short writes and EINTR.
Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = SysWrite(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path, errno);
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace

Status WriteFileAtomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", tmp, errno);
  Status s = WriteAll(fd, bytes, tmp);
  if (s.ok() && SysFsync(fd, "fsync") != 0) s = Errno("fsync", tmp, errno);
  if (::close(fd) != 0 && s.ok()) s = Errno("close", tmp, errno);
  if (s.ok()) s = fault::Hit("mid_marker");  // a crash here leaves only the temp file
  if (s.ok() && SysRename(tmp.c_str(), path.c_str()) != 0) s = Errno("rename", tmp, errno);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDir(Parent(path));
}

Result<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(fmt::format("'{}' does not exist", path));
    return Errno("open", path, errno);
  }
  // A file already larger than the limit is refused unread, before any of
  // it is held in memory.
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return DataLoss(fmt::format("'{}' is {} bytes, larger than {}", path, st.st_size, max_bytes));
  }
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = SysRead(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return Errno("read", path, err);
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      return DataLoss(fmt::format("'{}' is larger than {} bytes", path, max_bytes));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open directory", dir, errno);
  Status s;
  if (SysFsync(fd, "fsync_dir") != 0) s = Errno("fsync directory", dir, errno);
  ::close(fd);
  return s;
}

Status MakeDirs(const std::string& dir) {
  if (int e = fault::Errno("mkdir")) {
    return IoError(fmt::format("create directory '{}': {}", dir, std::strerror(e)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError(fmt::format("create directory '{}': {}", dir, ec.message()));
  return OkStatus();
}

Status RemoveAll(const std::string& path, const char* fault_point) {
  if (int e = fault::Errno(fault_point)) {
    return IoError(fmt::format("remove '{}': {}", path, std::strerror(e)));
  }
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return IoError(fmt::format("remove '{}': {}", path, ec.message()));
  return OkStatus();
}

Status Rename(const std::string& from, const std::string& to) {
  if (SysRename(from.c_str(), to.c_str()) != 0) {
    return IoError(fmt::format("rename '{}' to '{}': {}", from, to, std::strerror(errno)));
  }
  return OkStatus();
}

Result<std::vector<std::string>> ListDir(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return IoError(fmt::format("list directory '{}': {}", dir, ec.message()));
  return names;
}

Status Preallocate(const std::string& path, uint64_t bytes) {
  if (int e = fault::Errno("fallocate")) {
    return IoError(fmt::format("reserve {} bytes for '{}': {}", bytes, path, std::strerror(e)));
  }
  // A step of plain values only has no data to reserve (posix_fallocate
  // refuses a length of 0 with EINVAL).
  if (bytes == 0) return OkStatus();
  // Read-write: where the file system has no fallocate, glibc emulates it by
  // reading and writing every block, which fails on a write-only descriptor.
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Errno("open", path, errno);
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  ::close(fd);
  if (rc != 0) {
    return IoError(fmt::format("reserve {} bytes for '{}': {}", bytes, path, std::strerror(rc)));
  }
  return OkStatus();
}

Status FsyncFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path, errno);
  Status s;
  if (SysFsync(fd, "fsync") != 0) s = Errno("fsync", path, errno);
  ::close(fd);
  return s;
}

Status RemoveFile(const std::string& path) {
  if (SysUnlink(path.c_str()) != 0 && errno != ENOENT) return Errno("unlink", path, errno);
  return OkStatus();
}

Result<std::optional<int>> TryLockFile(const std::string& path, bool* unsupported) {
  *unsupported = false;
  if (int e = fault::Errno("lock")) return Errno("lock", path, e);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", path, errno);
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return std::optional<int>(fd);
  int err = errno;
  if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK) {
    *unsupported = true;  // e.g. Lustre mounted without -o flock
    return std::optional<int>(fd);
  }
  ::close(fd);
  if (err == EWOULDBLOCK) return std::optional<int>();
  return Errno("lock", path, err);
}

void UnlockFile(int fd) { ::close(fd); }

Status WriteFileReplacing(const std::string& path, const std::string& bytes) {
  if (int e = fault::Errno("lease")) return Errno("write", path, e);
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", tmp, errno);
  size_t done = 0;
  Status s;
  while (s.ok() && done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno != EINTR) s = Errno("write", tmp, errno);
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && s.ok()) s = Errno("close", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = Errno("rename", tmp, errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

uint64_t TreeBytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return std::filesystem::file_size(path, ec);
  uint64_t total = 0;
  for (std::filesystem::recursive_directory_iterator it(path, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}

}  // namespace mhckpt::io
