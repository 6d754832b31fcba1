// A root store in process memory (io/root_store.h): the same rules as the
// POSIX store, without a file system, for unit tests of the rules and of
// code above the seam. Nothing is durable: "durable" here means "done".
// Several stores made by OpenAgain share one root, as several processes
// share a directory; its ownership (rule 5) is one holder at a time, and
// ends when the RootOwnership is destroyed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/root_store.h"

namespace mhckpt::io {

class MemoryRootStore final : public RootStore {
 public:
  /// A new root called `name`, which does not exist until Create.
  static std::unique_ptr<MemoryRootStore> New(std::string name);
  /// Another store of the same root.
  [[nodiscard]] std::unique_ptr<MemoryRootStore> OpenAgain() const;

  /// For tests, as the data engine (or a save that crashed) would leave it:
  /// adds `bytes` of data to step `step`, creating the step if needed.
  void AddData(int64_t step, uint64_t bytes);

  [[nodiscard]] const std::string& root() const override;
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
  /// For tests: replaces step `step`'s marker by `text` as is, without the
  /// put protocol (a damaged or forged marker); creates the step if needed.
  void ReplaceMarkerText(int64_t step, std::string text);
  Status PutMarker(const Marker& marker, const std::string& text) override;
  Result<std::string> GetMarker(int64_t step) override;
  [[nodiscard]] std::string MarkerLocation(int64_t step) const override;
  uint64_t StepBytes(int64_t step) override;
  Status RemoveStep(int64_t step) override;
  Result<std::string> RetireStep(int64_t step) override;
  Result<std::vector<std::string>> RetiredSteps() override;
  Status RemoveRetired(const std::string& retired) override;

  struct State;  // the root, shared by the stores of it

 private:
  explicit MemoryRootStore(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace mhckpt::io
