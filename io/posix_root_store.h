// The root store of a directory on a POSIX file system that every rank sees
// (io/root_store.h): the layout of io/layout.h, the marker put by
// WriteFileAtomic (io/posix_file.h), the listing and retirement of
// io/catalog.h, and the lock and lease of io/root_lock.h. Every system call
// that can lose data goes through the fault seam of io/posix_file.cc.
#pragma once

#include <string>

#include "io/root_store.h"

namespace mhckpt::io {

class PosixRootStore final : public RootStore {
 public:
  /// The store of the directory `root` (which need not exist yet: Create).
  explicit PosixRootStore(std::string root) : root_(std::move(root)) {}

  [[nodiscard]] const std::string& root() const override { return root_; }
  bool Exists() override;
  Status Create() override;
  Status CheckWritable() override;
  Result<std::unique_ptr<RootOwnership>> Acquire(const RootLockOptions& options) override;
  Result<std::string> LeaseText() override;
  Result<std::string> GetLocalDeletions() override;
  Status PutLocalDeletions(const std::string& text) override;
  Result<std::vector<StepEntry>> ListSteps() override;
  Result<std::vector<int64_t>> StepsWithoutMarker() override;
  Status CreateStep(int64_t step) override;
  Status SyncStep(int64_t step) override;
  Status PutMarker(const Marker& marker, const std::string& text) override;
  Result<std::string> GetMarker(int64_t step) override;
  [[nodiscard]] std::string MarkerLocation(int64_t step) const override;
  uint64_t StepBytes(int64_t step) override;
  Status RemoveStep(int64_t step) override;
  Result<std::string> RetireStep(int64_t step) override;
  Result<std::vector<std::string>> RetiredSteps() override;
  Status RemoveRetired(const std::string& retired) override;

 private:
  const std::string root_;
};

}  // namespace mhckpt::io
