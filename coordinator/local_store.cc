#include "coordinator/local_store.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/fault.h"
#include "base/log.h"
#include "coordinator/root_upkeep.h"
#include "io/layout.h"
#include "io/posix_file.h"

namespace mhckpt::internal {

WriterFiles::WriterFiles(const io::Marker& m) : bytes(static_cast<size_t>(m.world_size), 0) {
  offset.resize(m.arrays.size());
  for (size_t ai = 0; ai < m.arrays.size(); ++ai) {
    const io::MarkerArray& a = m.arrays[ai];
    offset[ai].resize(a.boxes.size());
    for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
      const auto w = static_cast<size_t>(a.boxes[bi].writer);
      if (w >= bytes.size()) bytes.resize(w + 1, 0);
      offset[ai][bi] = bytes[w];
      bytes[w] += BoxBytes(a.boxes[bi].box, a.dtype);
    }
  }
}

std::string WriterFileName(int writer) { return fmt::format("w{}.bin", writer); }
std::string ParityFileName(int rank) { return fmt::format("p{}.bin", rank); }

std::string LocalPaths::FilePath(int64_t step, int writer) const {
  return io::StepDir(dir, step) + "/" + WriterFileName(writer);
}

std::string LocalPaths::ParityPath(int64_t step, int rank) const {
  return io::StepDir(dir, step) + "/" + ParityFileName(rank);
}

std::string LocalPaths::GroupsPath(int64_t step) const {
  return io::StepDir(dir, step) + "/parity.json";
}

// ---- StepHolds ----

StepHolds::Hold& StepHolds::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    Release();
    holds_ = std::exchange(o.holds_, nullptr);
    step_ = o.step_;
  }
  return *this;
}

void StepHolds::Hold::Release() {
  if (holds_ == nullptr) return;
  std::lock_guard<std::mutex> lock(holds_->mu_);
  auto it = holds_->count_.find(step_);
  if (it != holds_->count_.end() && --it->second == 0) holds_->count_.erase(it);
  holds_ = nullptr;
}

StepHolds::Hold StepHolds::Take(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  ++count_[step];
  return Hold(this, step);
}

bool StepHolds::IsHeld(int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_.count(step) > 0;
}

// ---- LocalStore ----

LocalStore::LocalStore(const std::string& dir) : paths_{dir}, store_(io::MakeRootStore(dir)) {}

LocalStore::~LocalStore() = default;

Result<std::vector<StoredStep>> LocalStore::Open(const Options& options) {
  MHCKPT_RETURN_IF_ERROR(store_->Create());
  MHCKPT_RETURN_IF_ERROR(store_->CheckWritable());
  MHCKPT_ASSIGN_OR_RETURN(ownership_,
                          store_->Acquire({options.root_lease_seconds, options.root_wait_seconds}));
  MHCKPT_RETURN_IF_ERROR(fault::Hit("local_open"));
  MHCKPT_RETURN_IF_ERROR(RemoveLeftovers(*store_, /*log=*/false));
  MHCKPT_ASSIGN_OR_RETURN(std::vector<io::StepEntry> steps, store_->ListSteps());
  std::vector<StoredStep> out;
  for (const io::StepEntry& e : steps) {
    if (!e.committed) {
      Logger()->warn("mhckpt: local step {} in '{}' is damaged, removed: {}", e.step, paths_.dir,
                     e.marker.ToString());
      MHCKPT_RETURN_IF_ERROR(store_->RemoveStep(e.step));
      continue;
    }
    StoredStep s;
    s.step = e.step;
    MHCKPT_ASSIGN_OR_RETURN(s.text, store_->GetMarker(e.step));
    MHCKPT_ASSIGN_OR_RETURN(s.marker, store_->ReadMarker(e.step));
    out.push_back(std::move(s));
  }
  return out;
}

Status LocalStore::MakeStepDir(int64_t step, const std::set<std::string>& rewritten) {
  const std::string& dir = paths_.dir;
  const std::string to = io::StepDir(dir, step);
  if (io::PathExists(io::MarkerPath(dir, step))) {
    return AlreadyExists(fmt::format("local step {} is committed in '{}'", step, dir));
  }
  const std::string from = std::exchange(spare_, std::string());
  if (from.empty() || !io::PathExists(from)) return store_->CreateStep(step);
  MHCKPT_RETURN_IF_ERROR(io::RemoveAll(to));
  MHCKPT_RETURN_IF_ERROR(io::Rename(from, to));
  MHCKPT_RETURN_IF_ERROR(io::FsyncDir(dir));
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, io::ListDir(to));
  for (const std::string& name : names) {
    if (!rewritten.count(name)) {
      MHCKPT_RETURN_IF_ERROR(io::RemoveAll(fmt::format("{}/{}", to, name)));
    }
  }
  return OkStatus();
}

Status LocalStore::Commit(const io::Marker& marker, const std::string& text,
                          const std::vector<std::vector<int>>& groups) {
  if (!groups.empty()) {
    MHCKPT_RETURN_IF_ERROR(
        io::WriteFileAtomic(paths_.GroupsPath(marker.step), nlohmann::json(groups).dump()));
  }
  MHCKPT_RETURN_IF_ERROR(store_->SyncStep(marker.step));
  MHCKPT_RETURN_IF_ERROR(fault::Hit("before_local_marker"));
  return store_->PutMarker(marker, text);
}

Status LocalStore::Remove(int64_t step) { return store_->RemoveStep(step); }

void LocalStore::Drop(int64_t step) {
  Status s;
  if (spare_.empty()) {
    Result<std::string> retired = store_->RetireStep(step);
    s = retired.status();
    if (retired.ok()) spare_ = std::move(retired).value();
  } else {
    s = store_->DeleteStep(step);
  }
  if (!s.ok()) Logger()->warn("mhckpt: local step {}: {}", step, s.ToString());
}

}  // namespace mhckpt::internal
