#include "coordinator/retention.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <set>
#include <utility>

#include "base/guard.h"
#include "base/log.h"
#include "base/status.h"
#include "coordinator/io_thread.h"
#include "io/marker.h"
#include "io/root_store.h"

namespace mhckpt::internal {

std::vector<int64_t> StepsToDelete(const std::vector<int64_t>& committed, int max_to_keep,
                                   int64_t keep_period) {
  std::vector<int64_t> out;
  if (max_to_keep <= 0) return out;
  const size_t keep_from = committed.size() > static_cast<size_t>(max_to_keep)
                               ? committed.size() - static_cast<size_t>(max_to_keep)
                               : 0;
  for (size_t i = 0; i < keep_from; ++i) {
    int64_t step = committed[i];
    if (keep_period > 0 && step % keep_period == 0) continue;
    out.push_back(step);
  }
  return out;
}

std::vector<int64_t> BestStepsToDelete(const std::vector<int64_t>& committed,
                                       const std::vector<std::optional<double>>& metrics,
                                       int max_to_keep, int64_t keep_period, const KeepBest& best) {
  std::vector<int64_t> out;
  if (max_to_keep <= 0 || committed.size() <= static_cast<size_t>(max_to_keep)) return out;
  // (metric, step), worst first: higher is better, or lower; then later.
  std::vector<std::pair<double, int64_t>> ranked;
  for (size_t i = 0; i < committed.size(); ++i) {
    if (metrics[i]) ranked.emplace_back(best.maximize ? *metrics[i] : -*metrics[i], committed[i]);
  }
  std::sort(ranked.begin(), ranked.end());
  std::set<int64_t> kept;
  for (size_t i = ranked.size() > static_cast<size_t>(max_to_keep)
                      ? ranked.size() - static_cast<size_t>(max_to_keep)
                      : 0;
       i < ranked.size(); ++i) {
    kept.insert(ranked[i].second);
  }
  for (size_t i = 0; i < committed.size(); ++i) {
    const int64_t step = committed[i];
    if (kept.count(step) != 0 || (keep_period > 0 && step % keep_period == 0)) continue;
    if (!metrics[i] && best.keep_without_metric) continue;
    out.push_back(step);
  }
  return out;
}

std::optional<double> MetricOf(const UserMetadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return std::nullopt;
  const std::string& text = it->second;
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || std::isnan(v)) return std::nullopt;
  return v;
}

std::vector<int64_t> StepsKeptByTime(const std::vector<int64_t>& committed,
                                     const std::vector<int64_t>& created_ms, int64_t interval_ms) {
  std::vector<int64_t> kept;
  if (interval_ms <= 0 || committed.empty()) return kept;
  int64_t last = created_ms[0];
  kept.push_back(committed[0]);
  for (size_t i = 1; i < committed.size(); ++i) {
    if (created_ms[i] - last < interval_ms) continue;
    last = created_ms[i];
    kept.push_back(committed[i]);
  }
  return kept;
}

Retention::Retention(io::RootStore* store, int max_to_keep, int64_t keep_period, KeepBest best,
                     int64_t keep_time_interval_ms)
    : store_(store),
      max_to_keep_(max_to_keep),
      keep_period_(keep_period),
      best_(std::move(best)),
      keep_time_interval_ms_(keep_time_interval_ms) {}

Retention::~Retention() = default;

Result<std::vector<int64_t>> Retention::ToDelete(const std::vector<int64_t>& steps) {
  const bool by_metric = !best_.metric.empty(), by_time = keep_time_interval_ms_ > 0;
  if (!by_metric && !by_time) return StepsToDelete(steps, max_to_keep_, keep_period_);
  std::vector<std::optional<double>> metrics;
  std::vector<int64_t> created;
  metrics.reserve(steps.size());
  created.reserve(steps.size());
  for (int64_t step : steps) {
    auto it = facts_.find(step);
    if (it == facts_.end()) {
      Result<io::Marker> m = store_->ReadMarker(step);
      // A marker that cannot be read stops the run (logged): nothing is
      // ranked, and nothing deleted, on a guess.
      if (!m.ok()) return m.status();
      MarkerFacts f;
      if (by_metric) f.metric = MetricOf(m->user_metadata, best_.metric);
      f.created_ms = m->created_unix_ms;
      it = facts_.emplace(step, f).first;
    }
    metrics.push_back(it->second.metric);
    created.push_back(it->second.created_ms);
  }
  // Forget the steps gone otherwise (another job's Delete).
  for (auto it = facts_.begin(); it != facts_.end();) {
    it = std::binary_search(steps.begin(), steps.end(), it->first) ? std::next(it)
                                                                   : facts_.erase(it);
  }
  std::vector<int64_t> out =
      by_metric ? BestStepsToDelete(steps, metrics, max_to_keep_, keep_period_, best_)
                : StepsToDelete(steps, max_to_keep_, keep_period_);
  const std::vector<int64_t> kept = StepsKeptByTime(steps, created, keep_time_interval_ms_);
  std::erase_if(out, [&](int64_t s) { return std::binary_search(kept.begin(), kept.end(), s); });
  return out;
}

double Retention::Run(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  // Guarded: the caller records the run whatever happens, or waiters hang.
  Status gc = Guarded("rank 0: retention", [&] {
    std::lock_guard<std::mutex> lock(mu_);
    MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> committed, store_->CommittedSteps());
    MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> old, ToDelete(committed));
    for (int64_t s : old) {
      MHCKPT_ASSIGN_OR_RETURN(std::string retired, store_->RetireStep(s));
      facts_.erase(s);
      if (!retired.empty()) RemoveInBackground(std::move(retired));
    }
    return OkStatus();
  });
  if (!gc.ok()) Logger()->warn("mhckpt: retention after step {}: {}", step, gc.ToString());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status Retention::Retire(int64_t step) {
  return Guarded("rank 0: delete", [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    MHCKPT_ASSIGN_OR_RETURN(std::string retired, store_->RetireStep(step));
    facts_.erase(step);  // its number may come back, with another marker
    if (retired.empty()) return NotFound(fmt::format("step {} is not committed", step));
    RemoveInBackground(std::move(retired));
    return OkStatus();
  });
}

void Retention::RemoveInBackground(std::string dir) {
  if (!deleter_) deleter_ = std::make_unique<IoThread>();
  deleter_->Submit([store = store_, dir = std::move(dir)] {
    Status s = store->RemoveRetired(dir);
    // Left behind, it is removed when the root is next opened.
    if (!s.ok()) Logger()->warn("mhckpt: removing retired '{}': {}", dir, s.ToString());
  });
}

void Retention::WaitForRemovals() {
  if (deleter_) deleter_->Drain();
}

}  // namespace mhckpt::internal
