#include "coordinator/local_landing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "io/posix_file.h"

namespace mhckpt::internal {
namespace {

// Mappings kept: a landing file goes round local_max_to_keep + 2 files.
constexpr size_t kKeptMappings = 8;

Status Errno(const std::string& what, const std::string& path, int err) {
  return IoError(fmt::format("{} '{}': {}", what, path, std::strerror(err)));
}

}  // namespace

// One file, mapped for writing; unmapped when the last holder lets go.
struct LandingFile::Mapped {
  Mapped(int f, const struct stat& st, std::byte* d, size_t n)
      : fd(f), dev(st.st_dev), ino(st.st_ino), data(d), size(n) {}
  ~Mapped() {
    if (data != nullptr) ::munmap(data, size);
    if (fd >= 0) ::close(fd);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  [[nodiscard]] bool Deleted() const {
    struct stat st {};
    return ::fstat(fd, &st) != 0 || st.st_nlink == 0;
  }
  int fd;
  dev_t dev;
  ino_t ino;
  std::byte* data;
  size_t size;
};

// A save's hold on the landing file: its staging buffer's owner.
struct LandingFile::Lease {
  Lease(LandingFile* l, uint64_t t, std::shared_ptr<Mapped> m)
      : landing(l), token(t), map(std::move(m)) {}
  ~Lease() { landing->Release(token); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  LandingFile* landing;
  uint64_t token;
  std::shared_ptr<Mapped> map;
};

LandingFile::LandingFile(const std::string& dir, int rank)
    : dir_(dir), path_(fmt::format("{}/landing-r{}.bin", dir, rank)) {}

LandingFile::~LandingFile() = default;

Result<StagingBuffer> LandingFile::Acquire(size_t bytes, double* waited_seconds) {
  uint64_t token = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (held_) {
      auto t0 = std::chrono::steady_clock::now();
      cv_.wait(lock, [this] { return !held_; });
      if (waited_seconds != nullptr) {
        *waited_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    held_ = true;
    token = ++token_;
  }
  return MapHeld(token, bytes, false);
}

std::optional<StagingBuffer> LandingFile::TryAcquire(size_t bytes, bool warm_only) {
  uint64_t token = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_) return std::nullopt;
    held_ = true;
    token = ++token_;
  }
  Result<StagingBuffer> buffer = MapHeld(token, bytes, warm_only);
  if (!buffer.ok()) return std::nullopt;
  return std::move(buffer).value();
}

Result<StagingBuffer> LandingFile::MapHeld(uint64_t token, size_t bytes, bool warm_only) {
  // The holder alone touches the file and the kept mappings from here.
  auto fail = [&](Status s) {
    Release(token);
    return s;
  };
  int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
  bool created = false;
  if (fd < 0 && errno == ENOENT && !warm_only) {
    fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    created = fd >= 0;
  }
  if (fd < 0) return fail(Errno(warm_only ? "cannot open" : "cannot create", path_, errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(Errno("cannot stat", path_, err));
  }
  std::shared_ptr<Mapped> map;
  std::erase_if(maps_, [](const std::shared_ptr<Mapped>& m) { return m->Deleted(); });
  for (const std::shared_ptr<Mapped>& m : maps_) {
    if (m->dev == st.st_dev && m->ino == st.st_ino && m->size == bytes &&
        static_cast<uint64_t>(st.st_size) == bytes) {
      map = m;
    }
  }
  if (map != nullptr) {
    ::close(fd);
  } else if (warm_only) {
    ::close(fd);
    return fail(NotFound(fmt::format("no kept mapping of '{}'", path_)));
  } else {
    std::erase_if(maps_, [&](const std::shared_ptr<Mapped>& m) {
      return m->dev == st.st_dev && m->ino == st.st_ino;
    });
    Status s;
    if (static_cast<uint64_t>(st.st_size) != bytes &&
        ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      s = Errno("cannot size", path_, errno);
    }
    if (s.ok()) {
      const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (err != 0) s = Errno(fmt::format("cannot reserve {} bytes in", bytes), path_, err);
    }
    void* p = MAP_FAILED;
    if (s.ok()) {
      p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      if (p == MAP_FAILED) s = Errno("cannot map", path_, errno);
    }
    if (!s.ok()) {
      ::close(fd);
      return fail(s);
    }
    st.st_size = static_cast<off_t>(bytes);
    map = std::make_shared<Mapped>(fd, st, static_cast<std::byte*>(p), bytes);
    // A new file's name durable before the local write moves it into a step
    // (whose directory fsync makes the move durable, not this name).
    if (created) {
      if (Status synced = io::FsyncDir(dir_); !synced.ok()) return fail(synced);
    }
    maps_.push_back(map);
    if (maps_.size() > kKeptMappings) maps_.erase(maps_.begin());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_map_ = map;
  }
  auto lease = std::make_shared<Lease>(this, token, map);
  return StagingBuffer::Borrowed(map->data, bytes, std::move(lease));
}

bool LandingFile::Take(const std::byte* data, uint64_t bytes, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_ || held_map_ == nullptr || held_map_->data != data || held_map_->size != bytes) {
    return false;
  }
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != ENOENT || ::rename(path_.c_str(), path.c_str()) != 0) return false;
  }
  held_ = false;
  held_map_.reset();
  cv_.notify_all();
  return true;
}

void LandingFile::Release(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_ || token != token_) return;
  held_ = false;
  held_map_.reset();
  cv_.notify_all();
}

}  // namespace mhckpt::internal
