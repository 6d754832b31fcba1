#include "coordinator/local_landing.h"

#include <fcntl.h>

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

}  // namespace

// A save's hold on the landing file: its staging buffer's owner.
struct LandingFile::Lease {
  Lease(LandingFile* l, uint64_t t, std::shared_ptr<io::KeptMappings::Mapping> m)
      : landing(l), token(t), map(std::move(m)) {}
  ~Lease() { landing->Release(token); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  LandingFile* landing;
  uint64_t token;
  std::shared_ptr<io::KeptMappings::Mapping> map;
};

LandingFile::LandingFile(const std::string& dir, int rank)
    : dir_(dir), path_(fmt::format("{}/landing-r{}.bin", dir, rank)), maps_(kKeptMappings) {}

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
  bool created = false;
  Result<std::shared_ptr<io::KeptMappings::Mapping>> mapped = maps_.Map(
      path_, bytes, warm_only ? io::KeptMappings::Mode::kWarmOnly : io::KeptMappings::Mode::kCreate,
      &created);
  if (!mapped.ok()) return fail(mapped.status());
  std::shared_ptr<io::KeptMappings::Mapping> map = std::move(mapped).value();
  // A new file's name durable before the local write moves it into a step
  // (whose directory fsync makes the move durable, not this name).
  if (created) {
    if (Status synced = io::FsyncDir(dir_); !synced.ok()) return fail(synced);
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
