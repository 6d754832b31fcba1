// Whether a directory's file system takes O_DIRECT, for the tests of the
// direct paths: where it does not, those tests report themselves skipped
// (GTEST_SKIP) instead of passing on the buffered fallback alone.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mhckpt::testing {

/// Empty if a file created under `dir` opens with O_DIRECT and takes one
/// aligned page written through it; else why not, naming `dir` (ramfs,
/// tmpfs before Linux 6.6 and some FUSE file systems refuse).
inline std::string DirectIoRefused(const std::string& dir) {
  constexpr size_t kPage = 4096;
  const std::string path = dir + "/.mhckpt-direct-probe-" + std::to_string(::getpid());
  std::string why;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0) {
    why = std::string("open: ") + std::strerror(errno);
  } else {
    void* page = std::aligned_alloc(kPage, kPage);
    std::memset(page, 0x5A, kPage);
    const ssize_t n = ::pwrite(fd, page, kPage, 0);
    if (n < 0) why = std::string("an aligned write: ") + std::strerror(errno);
    if (n >= 0 && n != static_cast<ssize_t>(kPage)) why = "an aligned write was cut short";
    std::free(page);
    ::close(fd);
  }
  ::unlink(path.c_str());
  return why.empty() ? why : "the file system under " + dir + " refuses O_DIRECT (" + why + ")";
}

}  // namespace mhckpt::testing
