#include "io/posix_root_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "io/catalog.h"
#include "io/layout.h"
#include "io/posix_file.h"

namespace mhckpt::io {
namespace {

constexpr size_t kMaxLocalDeletionsBytes = size_t{1} << 20;

// The flock and lease of io/root_lock.h, held until destroyed.
class PosixOwnership final : public RootOwnership {
 public:
  explicit PosixOwnership(std::unique_ptr<RootLock> lock) : lock_(std::move(lock)) {}
  [[nodiscard]] const std::optional<Lease>& taken_over() const override {
    return lock_->taken_over();
  }

 private:
  std::unique_ptr<RootLock> lock_;
};

}  // namespace

bool PosixRootStore::Exists() {
  std::error_code ec;
  return std::filesystem::is_directory(root_, ec);
}

Status PosixRootStore::Create() {
  std::error_code ec;
  if (std::filesystem::exists(root_, ec) && !std::filesystem::is_directory(root_, ec)) {
    return InvalidArgument(fmt::format("the root '{}' is not a directory", root_));
  }
  return MakeDirs(root_);
}

Status PosixRootStore::CheckWritable() {
  if (::access(root_.c_str(), W_OK | X_OK) != 0) {
    return IoError(fmt::format("the root '{}' is not writable: {}", root_, std::strerror(errno)));
  }
  return OkStatus();
}

Result<std::unique_ptr<RootOwnership>> PosixRootStore::Acquire(const RootLockOptions& options) {
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<RootLock> lock, RootLock::Acquire(root_, options));
  return std::unique_ptr<RootOwnership>(std::make_unique<PosixOwnership>(std::move(lock)));
}

Result<std::string> PosixRootStore::LeaseText() {
  return ReadSmallFile(root_ + "/" + std::string(kLeaseFileName), kMaxLeaseBytes);
}

Result<std::string> PosixRootStore::GetLocalDeletions() {
  return ReadSmallFile(root_ + "/" + std::string(kLocalDeletionsFileName), kMaxLocalDeletionsBytes);
}

Status PosixRootStore::PutLocalDeletions(const std::string& text) {
  return WriteFileAtomic(root_ + "/" + std::string(kLocalDeletionsFileName), text);
}

Result<std::vector<StepEntry>> PosixRootStore::ListSteps() { return io::ListSteps(root_); }

Result<std::vector<int64_t>> PosixRootStore::StepsWithoutMarker() {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root_));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    std::optional<int64_t> step = ParseStepDirName(name);
    if (step && !PathExists(MarkerPath(root_, *step))) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Status PosixRootStore::CreateStep(int64_t step) {
  if (PathExists(MarkerPath(root_, step))) {
    return AlreadyExists(fmt::format("step {} is already committed in '{}'", step, root_));
  }
  MHCKPT_RETURN_IF_ERROR(RemoveAll(StepDir(root_, step)));
  MHCKPT_RETURN_IF_ERROR(MakeDirs(StepDir(root_, step)));
  return FsyncDir(root_);
}

Status PosixRootStore::SyncStep(int64_t step) { return FsyncDir(StepDir(root_, step)); }

Status PosixRootStore::PutMarker(const Marker& marker, const std::string& text) {
  MHCKPT_RETURN_IF_ERROR(WriteFileAtomic(MarkerPath(root_, marker.step), text));
  RememberValidMarker(root_, marker, text);
  return OkStatus();
}

Result<std::string> PosixRootStore::GetMarker(int64_t step) {
  return ReadSmallFile(MarkerPath(root_, step), kMaxMarkerBytes);
}

std::string PosixRootStore::MarkerLocation(int64_t step) const { return MarkerPath(root_, step); }

uint64_t PosixRootStore::StepBytes(int64_t step) { return TreeBytes(StepDir(root_, step)); }

Status PosixRootStore::RemoveStep(int64_t step) {
  const std::string dir = StepDir(root_, step);
  if (PathExists(MarkerPath(root_, step))) {
    MHCKPT_RETURN_IF_ERROR(RemoveFile(MarkerPath(root_, step)));
    MHCKPT_RETURN_IF_ERROR(FsyncDir(dir));
  }
  if (!PathExists(dir)) return OkStatus();
  MHCKPT_RETURN_IF_ERROR(RemoveAll(dir));
  return FsyncDir(root_);
}

Result<std::string> PosixRootStore::RetireStep(int64_t step) { return io::RetireStep(root_, step); }

Result<std::vector<std::string>> PosixRootStore::RetiredSteps() { return RetiredDirs(root_); }

Status PosixRootStore::RemoveRetired(const std::string& retired) {
  // Only what RetireStep named: never a path outside the root's retired ones.
  const std::string prefix = fmt::format("{}/{}", root_, kRetiredPrefix);
  if (!retired.starts_with(prefix) || retired.find('/', prefix.size()) != std::string::npos) {
    return InvalidArgument(fmt::format("'{}' is not a retired step of '{}'", retired, root_));
  }
  MHCKPT_RETURN_IF_ERROR(RemoveAll(retired, "remove_step"));
  return FsyncDir(root_);
}

}  // namespace mhckpt::io
