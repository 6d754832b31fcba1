#include "io/catalog.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "base/fault.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/posix_file.h"

namespace mhckpt::io {

namespace {

// Marker texts this process has already parsed and found valid, by path:
// listing a root after every save (retention) would otherwise parse every
// kept marker again, ~0.1 s each for 10,000 arrays (docs/PERFORMANCE.md,
// "Many small arrays"). The file is still read every time, and its bytes are
// compared (XXH3-128 and length) with those parsed before: any change, in
// place or by rename, means a new parse. Only valid markers are remembered.
struct Seen {
  XXH128_hash_t hash{};
  size_t size = 0;
  int64_t step = 0;
};

struct ValidMarkers {
  std::mutex mu;
  std::map<std::string, Seen> by_path;
};

ValidMarkers& Cache() {
  static auto* cache = new ValidMarkers;  // never destroyed: may be used at exit
  return *cache;
}

void Remember(const std::string& path, const std::string& text, int64_t step) {
  std::lock_guard<std::mutex> lock(Cache().mu);
  Cache().by_path[path] = Seen{XXH3_128bits(text.data(), text.size()), text.size(), step};
}

// The step recorded by the valid marker of `step` under `root`; NotFound if
// there is none, DataLoss if it is invalid.
Result<int64_t> MarkerStep(const std::string& root, int64_t step) {
  const std::string path = MarkerPath(root, step);
  MHCKPT_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxMarkerBytes));
  {
    const XXH128_hash_t hash = XXH3_128bits(text.data(), text.size());
    std::lock_guard<std::mutex> lock(Cache().mu);
    auto it = Cache().by_path.find(path);
    if (it != Cache().by_path.end() && it->second.size == text.size() &&
        XXH128_isEqual(it->second.hash, hash)) {
      return it->second.step;
    }
  }
  MHCKPT_ASSIGN_OR_RETURN(Marker m, ParseMarker(text, path));
  Remember(path, text, m.step);
  return m.step;
}

}  // namespace

void RememberValidMarker(const std::string& root, const Marker& marker, const std::string& text) {
  // `text` is MarkerToJson(marker), which parses back to `marker`: valid if
  // the checks after a parse accept it.
  if (CheckMarker(marker, MarkerPath(root, marker.step)).ok()) {
    Remember(MarkerPath(root, marker.step), text, marker.step);
  }
}

Result<std::vector<StepEntry>> ListSteps(const std::string& root) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<StepEntry> steps;
  for (const std::string& name : names) {
    auto step = ParseStepDirName(name);
    if (!step) continue;
    StepEntry e{*step, false, OkStatus()};
    Result<int64_t> m = MarkerStep(root, *step);
    if (m.ok() && *m == *step) {
      e.committed = true;
    } else if (m.ok()) {
      e.marker = DataLoss(fmt::format("marker of step {} says step {}", *step, *m));
    } else if (m.status().code() != StatusCode::kNotFound) {
      e.marker = m.status();
    }
    steps.push_back(std::move(e));
  }
  std::sort(steps.begin(), steps.end(),
            [](const StepEntry& a, const StepEntry& b) { return a.step < b.step; });
  return steps;
}

Result<std::vector<int64_t>> CommittedSteps(const std::string& root) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepEntry> all, ListSteps(root));
  std::vector<int64_t> steps;
  for (const StepEntry& e : all) {
    if (e.committed) steps.push_back(e.step);
  }
  return steps;
}

Result<std::string> RetireStep(const std::string& root, int64_t step) {
  const std::string marker = MarkerPath(root, step);
  const std::string dir = StepDir(root, step);
  MHCKPT_RETURN_IF_ERROR(RemoveFile(marker));
  if (!PathExists(dir)) return std::string();
  MHCKPT_RETURN_IF_ERROR(FsyncDir(dir));
  MHCKPT_RETURN_IF_ERROR(fault::Hit("retention"));  // uncommitted now, files still there
  // The nonce: the clock, and a counter for two retirements in one tick.
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const std::string retired =
      fmt::format("{}/{}{}.{:x}.{}", root, kRetiredPrefix, StepDirName(step),
                  std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(), counter++);
  MHCKPT_RETURN_IF_ERROR(Rename(dir, retired));
  MHCKPT_RETURN_IF_ERROR(FsyncDir(root));
  return retired;
}

Result<std::vector<std::string>> RetiredDirs(const std::string& root) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name.starts_with(kRetiredPrefix)) out.push_back(fmt::format("{}/{}", root, name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status DeleteStep(const std::string& root, int64_t step) {
  MHCKPT_ASSIGN_OR_RETURN(std::string retired, RetireStep(root, step));
  if (retired.empty()) return OkStatus();
  MHCKPT_RETURN_IF_ERROR(RemoveAll(retired, "remove_step"));
  return FsyncDir(root);
}

}  // namespace mhckpt::io
