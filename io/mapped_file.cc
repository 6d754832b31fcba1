#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace mhckpt::io {
namespace {

Status MappedErrno(const std::string& what, const std::string& path, int err) {
  if (err == ENOENT) return NotFound(fmt::format("{} '{}': {}", what, path, std::strerror(err)));
  return IoError(fmt::format("{} '{}': {}", what, path, std::strerror(err)));
}

// Closes `fd` and returns `s`.
Status Closing(int fd, Status s) {
  ::close(fd);
  return s;
}

// File `fd` (at `path`) sized to `bytes`, every byte reserved (a full tmpfs
// fails here, not with SIGBUS on a write into the mapping), and mapped for
// writing; nullptr for 0 bytes. An existing file keeps its pages (a recycled
// step's: no fresh memory to fault in and clear).
Result<std::byte*> SizeAndMap(int fd, const std::string& path, uint64_t bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return MappedErrno("cannot stat", path, errno);
  if (static_cast<uint64_t>(st.st_size) != bytes &&
      ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return MappedErrno("cannot size", path, errno);
  }
  if (bytes == 0) return nullptr;
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    return MappedErrno(fmt::format("cannot reserve {} bytes in", bytes), path, err);
  }
  // MAP_POPULATE: the pages are mapped in one call, not by a fault per page.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return MappedErrno("cannot map", path, errno);
  return static_cast<std::byte*>(p);
}

}  // namespace

Result<MappedFile> MappedFile::Create(const std::string& path, uint64_t bytes) {
  MappedFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f.fd_ < 0) return MappedErrno("cannot create", path, errno);
  MHCKPT_ASSIGN_OR_RETURN(f.data_, SizeAndMap(f.fd_, path, bytes));
  f.size_ = bytes;
  return f;
}

Result<MappedFile> MappedFile::CreateByWrites(const std::string& path, uint64_t bytes,
                                              std::span<const Piece> pieces) {
  {
    // Not truncated: an existing file's pages are written over (pieces
    // cover the whole file), not freed and allocated again.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return MappedErrno("cannot create", path, errno);
    Status s;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
      s = MappedErrno("cannot size", path, errno);
    for (const Piece& p : pieces) {
      for (uint64_t done = 0; s.ok() && done < p.size;) {
        const ssize_t n =
            ::pwrite(fd, p.data + done, p.size - done, static_cast<off_t>(p.offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          s = MappedErrno(
              fmt::format("cannot write {} bytes at {} of", p.size - done, p.offset + done), path,
              n < 0 ? errno : ENOSPC);
          break;
        }
        done += static_cast<uint64_t>(n);
      }
      if (!s.ok()) break;
    }
    if (::close(fd) != 0 && s.ok()) s = MappedErrno("cannot close", path, errno);
    if (!s.ok()) return s;
  }
  return OpenForReading(path);
}

Result<MappedFile> MappedFile::OpenForReading(const std::string& path) {
  MappedFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) return MappedErrno("cannot open", path, errno);
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) return MappedErrno("cannot stat", path, errno);
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED | MAP_POPULATE, f.fd_, 0);
    if (p == MAP_FAILED) return MappedErrno("cannot map", path, errno);
    f.data_ = static_cast<std::byte*>(p);
  }
  return f;
}

Result<uint64_t> MappedFile::Size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return MappedErrno("cannot stat", path, errno);
  return static_cast<uint64_t>(st.st_size);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    Close().IgnoreError();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Close().IgnoreError(); }

Status MappedFile::Close() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  if (fd_ >= 0 && ::close(std::exchange(fd_, -1)) != 0)
    return MappedErrno("cannot close", path_, errno);
  return OkStatus();
}

KeptMappings::Mapping::~Mapping() {
  if (data != nullptr) ::munmap(data, size);
  if (fd >= 0) ::close(fd);
}

bool KeptMappings::Mapping::Deleted() const {
  struct stat st {};
  return ::fstat(fd, &st) != 0 || st.st_nlink == 0;
}

Result<std::shared_ptr<KeptMappings::Mapping>> KeptMappings::Map(const std::string& path,
                                                                 uint64_t bytes, Mode mode,
                                                                 bool* created) {
  if (created != nullptr) *created = false;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT && mode == Mode::kCreate) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 && created != nullptr) *created = true;
  }
  if (fd < 0)
    return MappedErrno(mode == Mode::kCreate ? "cannot create" : "cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Closing(fd, MappedErrno("cannot stat", path, errno));
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(maps_, [](const std::shared_ptr<Mapping>& m) { return m->Deleted(); });
    for (const std::shared_ptr<Mapping>& m : maps_) {
      if (m->dev == st.st_dev && m->ino == st.st_ino && m->size == bytes &&
          static_cast<uint64_t>(st.st_size) == bytes) {
        ::close(fd);
        return m;
      }
    }
  }
  if (mode == Mode::kWarmOnly) {
    return Closing(fd, NotFound(fmt::format("no kept mapping of '{}' at {} bytes", path, bytes)));
  }
  Result<std::byte*> data = SizeAndMap(fd, path, bytes);
  if (!data.ok()) return Closing(fd, data.status());
  auto map = std::make_shared<Mapping>(fd, st.st_dev, st.st_ino, *data, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  // A mapping of the file at another size is stale now.
  std::erase_if(maps_, [&](const std::shared_ptr<Mapping>& m) {
    return m->dev == map->dev && m->ino == map->ino;
  });
  maps_.push_back(map);
  if (maps_.size() > keep_) maps_.erase(maps_.begin());
  return map;
}

void KeptMappings::ForgetDeleted() {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(maps_, [](const std::shared_ptr<Mapping>& m) { return m->Deleted(); });
}

size_t KeptMappings::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return maps_.size();
}

}  // namespace mhckpt::io
