#include "io/memory_root_store.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/catalog.h"
#include "io/layout.h"

namespace mhckpt::io {

struct MemoryRootStore::State {
  struct Step {
    std::optional<std::string> marker;
    uint64_t data_bytes = 0;
  };

  explicit State(std::string n) : name(std::move(n)) {}

  const std::string name;
  std::mutex mu;
  std::condition_variable released;  // `owner` was reset
  bool exists = false;
  std::map<int64_t, Step> steps;
  std::map<std::string, Step> retired;
  uint64_t retirements = 0;    // the nonce of retired names
  std::optional<Lease> owner;  // the holder's lease, while held
  std::optional<std::string> local_deletions;
};

namespace {

using State = MemoryRootStore::State;

// The ownership of a memory root: held while this object lives.
class MemoryOwnership final : public RootOwnership {
 public:
  explicit MemoryOwnership(std::shared_ptr<State> state) : state_(std::move(state)) {}
  ~MemoryOwnership() override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->owner.reset();
    }
    state_->released.notify_all();
  }
  [[nodiscard]] const std::optional<Lease>& taken_over() const override { return none_; }

 private:
  std::shared_ptr<State> state_;
  const std::optional<Lease> none_;  // a memory root's holder never dies unnoticed
};

Status InUse(const State& s) {
  return FailedPrecondition(fmt::format(
      "checkpoint root '{}' is in use by another job ({}): it holds the root's lock; nothing "
      "was changed",
      s.name, DescribeHolder(*s.owner, s.owner->heartbeat_unix_ms)));
}

std::string RetiredPrefix(const State& s) { return fmt::format("{}/{}", s.name, kRetiredPrefix); }

Status NoStep(const State& s, int64_t step) {
  return IoError(fmt::format("step {} does not exist in '{}'", step, s.name));
}

}  // namespace

std::unique_ptr<MemoryRootStore> MemoryRootStore::New(std::string name) {
  return std::unique_ptr<MemoryRootStore>(
      new MemoryRootStore(std::make_shared<State>(std::move(name))));
}

std::unique_ptr<MemoryRootStore> MemoryRootStore::OpenAgain() const {
  return std::unique_ptr<MemoryRootStore>(new MemoryRootStore(state_));
}

void MemoryRootStore::AddData(int64_t step, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->steps[step].data_bytes += bytes;
}

void MemoryRootStore::ReplaceMarkerText(int64_t step, std::string text) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->steps[step].marker = std::move(text);
}

const std::string& MemoryRootStore::root() const { return state_->name; }

bool MemoryRootStore::Exists() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->exists;
}

Status MemoryRootStore::Create() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->exists = true;
  return OkStatus();
}

Status MemoryRootStore::CheckWritable() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->exists) return IoError(fmt::format("the root '{}' does not exist", state_->name));
  return OkStatus();
}

Result<std::unique_ptr<RootOwnership>> MemoryRootStore::Acquire(const RootLockOptions& options) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(std::max(0.0, options.wait_seconds));
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->exists) return IoError(fmt::format("the root '{}' does not exist", state_->name));
  while (state_->owner) {
    if (std::chrono::steady_clock::now() >= deadline) return InUse(*state_);
    // As the POSIX store does between tries: a test's gate (base/fault.h).
    lock.unlock();
    MHCKPT_RETURN_IF_ERROR(fault::Hit("root_busy"));
    lock.lock();
    state_->released.wait_until(lock, deadline, [this] { return !state_->owner; });
  }
  state_->owner = CurrentProcessLease();
  return std::unique_ptr<RootOwnership>(std::make_unique<MemoryOwnership>(state_));
}

Result<std::string> MemoryRootStore::LeaseText() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->owner) return NotFound(fmt::format("'{}' has no owner", state_->name));
  return LeaseToJson(*state_->owner);
}

Result<std::string> MemoryRootStore::GetLocalDeletions() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->local_deletions) {
    return NotFound(fmt::format("'{}' records no deleted local save", state_->name));
  }
  return *state_->local_deletions;
}

Status MemoryRootStore::PutLocalDeletions(const std::string& text) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->local_deletions = text;
  return OkStatus();
}

Result<std::vector<StepEntry>> MemoryRootStore::ListSteps() {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<StepEntry> out;
  for (const auto& [step, s] : state_->steps) {  // ascending: a std::map
    StepEntry e{step, false, OkStatus()};
    if (s.marker) {
      Result<Marker> m = ParseMarker(*s.marker, MarkerLocation(step));
      if (m.ok() && m->step == step) {
        e.committed = true;
      } else if (m.ok()) {
        e.marker = DataLoss(fmt::format("marker of step {} says step {}", step, m->step));
      } else {
        e.marker = m.status();
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

Result<std::vector<int64_t>> MemoryRootStore::StepsWithoutMarker() {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<int64_t> out;
  for (const auto& [step, s] : state_->steps) {
    if (!s.marker) out.push_back(step);
  }
  return out;
}

Status MemoryRootStore::CreateStep(int64_t step) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->steps.find(step);
  if (it != state_->steps.end() && it->second.marker) {
    return AlreadyExists(fmt::format("step {} is already committed in '{}'", step, state_->name));
  }
  state_->steps[step] = State::Step{};
  return OkStatus();
}

Status MemoryRootStore::SyncStep(int64_t step) {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->steps.count(step) ? OkStatus() : NoStep(*state_, step);
}

Status MemoryRootStore::PutMarker(const Marker& marker, const std::string& text) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->steps.find(marker.step);
  if (it == state_->steps.end()) return NoStep(*state_, marker.step);
  it->second.marker = text;
  return OkStatus();
}

Result<std::string> MemoryRootStore::GetMarker(int64_t step) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->steps.find(step);
  if (it == state_->steps.end() || !it->second.marker) {
    return NotFound(fmt::format("'{}' does not exist", MarkerLocation(step)));
  }
  if (it->second.marker->size() > kMaxMarkerBytes) {
    return DataLoss(fmt::format("'{}' is {} bytes, larger than {}", MarkerLocation(step),
                                it->second.marker->size(), kMaxMarkerBytes));
  }
  return *it->second.marker;
}

std::string MemoryRootStore::MarkerLocation(int64_t step) const {
  return MarkerPath(state_->name, step);
}

uint64_t MemoryRootStore::StepBytes(int64_t step) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->steps.find(step);
  if (it == state_->steps.end()) return 0;
  return it->second.data_bytes + (it->second.marker ? it->second.marker->size() : 0);
}

Status MemoryRootStore::RemoveStep(int64_t step) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->steps.find(step);
  if (it == state_->steps.end()) return OkStatus();
  it->second.marker.reset();  // rule 3: uncommitted first
  // The POSIX store's removal of the step's files can fail here: so can this.
  if (int e = fault::Errno("remove")) {
    return IoError(fmt::format("remove step {} of '{}': {}", step, state_->name, std::strerror(e)));
  }
  state_->steps.erase(it);
  return OkStatus();
}

Result<std::string> MemoryRootStore::RetireStep(int64_t step) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->steps.find(step);
  if (it == state_->steps.end()) return std::string();
  it->second.marker.reset();  // rule 3: uncommitted first
  MHCKPT_RETURN_IF_ERROR(fault::Hit("retention"));
  std::string name =
      fmt::format("{}{}.{}", RetiredPrefix(*state_), StepDirName(step), state_->retirements++);
  state_->retired[name] = std::move(it->second);
  state_->steps.erase(it);
  return name;
}

Result<std::vector<std::string>> MemoryRootStore::RetiredSteps() {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<std::string> out;
  for (const auto& entry : state_->retired) out.push_back(entry.first);
  return out;
}

Status MemoryRootStore::RemoveRetired(const std::string& retired) {
  std::lock_guard<std::mutex> lock(state_->mu);
  const std::string prefix = RetiredPrefix(*state_);
  if (!retired.starts_with(prefix) || retired.find('/', prefix.size()) != std::string::npos) {
    return InvalidArgument(
        fmt::format("'{}' is not a retired step of '{}'", retired, state_->name));
  }
  state_->retired.erase(retired);
  return OkStatus();
}

}  // namespace mhckpt::io
