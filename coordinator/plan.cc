#include "coordinator/plan.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mhckpt {
namespace {

using nlohmann::json;

struct Holding {
  Box box;
  std::vector<int> holders;  // ascending ranks
  int64_t bytes = 0;
};

// Checks that the distinct non-empty boxes of `name` neither overlap partially
// nor leave holes. Sweeps boxes sorted by their start in dimension 0.
Status CheckTiling(const std::string& name, const std::vector<int64_t>& shape,
                   const std::vector<Holding>& boxes) {
  int64_t covered = 0;
  for (const Holding& h : boxes) covered += *Volume(h.box.count);
  if (!shape.empty()) {
    std::vector<const Holding*> sorted;
    sorted.reserve(boxes.size());
    for (const Holding& h : boxes) sorted.push_back(&h);
    std::sort(sorted.begin(), sorted.end(),
              [](const Holding* a, const Holding* b) { return a->box.start[0] < b->box.start[0]; });
    for (size_t i = 0; i < sorted.size(); ++i) {
      const Box& a = sorted[i]->box;
      for (size_t j = i + 1; j < sorted.size() && sorted[j]->box.start[0] < a.start[0] + a.count[0];
           ++j) {
        const Box& b = sorted[j]->box;
        if (BoxesIntersect(a, b)) {
          return InvalidArgument(
              fmt::format("array '{}': box {} (rank {}) and box {} (rank {}) overlap partially",
                          name, BoxToString(a), sorted[i]->holders.front(), BoxToString(b),
                          sorted[j]->holders.front()));
        }
      }
    }
  }
  int64_t volume = *Volume(shape);
  if (covered != volume) {
    return InvalidArgument(fmt::format(
        "array '{}' of shape {}: the boxes of all ranks cover {} of {} elements (holes)", name,
        ShapeToString(shape), covered, volume));
  }
  return OkStatus();
}

}  // namespace

RankDescription Describe(int64_t step, const Status& local, const Snapshot& snapshot) {
  RankDescription d{step, local, {}};
  for (const StagedArray& a : snapshot.arrays) {
    ArrayDescription ad{a.name, a.dtype, a.shape, {}};
    for (const StagedBox& b : a.boxes) ad.boxes.push_back(b.box);
    d.arrays.push_back(std::move(ad));
  }
  return d;
}

std::string EncodeDescription(const RankDescription& d) {
  json arrays = json::array();
  for (const ArrayDescription& a : d.arrays) {
    json boxes = json::array();
    for (const Box& b : a.boxes) boxes.push_back(json::array({b.start, b.count}));
    arrays.push_back(json::array({a.name, static_cast<int>(a.dtype), a.shape, std::move(boxes)}));
  }
  json j = json::array({d.step, static_cast<int>(d.status.code()), d.status.message(), arrays});
  std::vector<uint8_t> cbor = json::to_cbor(j);
  return {cbor.begin(), cbor.end()};
}

Result<RankDescription> DecodeDescription(const std::string& bytes) {
  try {
    json j = json::from_cbor(bytes);
    RankDescription d;
    d.step = j.at(0).get<int64_t>();
    d.status = Status(static_cast<StatusCode>(j.at(1).get<int>()), j.at(2).get<std::string>());
    for (const json& ja : j.at(3)) {
      ArrayDescription a{ja.at(0).get<std::string>(),
                         static_cast<DType>(ja.at(1).get<int>()),
                         ja.at(2).get<std::vector<int64_t>>(),
                         {}};
      for (const json& jb : ja.at(3)) {
        a.boxes.push_back(
            Box{jb.at(0).get<std::vector<int64_t>>(), jb.at(1).get<std::vector<int64_t>>()});
      }
      d.arrays.push_back(std::move(a));
    }
    return d;
  } catch (const json::exception& e) {
    return Internal(fmt::format("cannot decode a rank's description: {}", e.what()));
  }
}

std::vector<Box> SplitRows(const Box& box, int parts) {
  const int64_t rows = box.count.empty() ? 0 : box.count[0];
  const int n = static_cast<int>(std::min<int64_t>(parts, rows));
  if (n < 2) return {box};
  std::vector<Box> slices;
  for (int i = 0; i < n; ++i) {
    auto [begin, end] = SplitRange(rows, n, i);
    Box slice = box;
    slice.start[0] = box.start[0] + begin;
    slice.count[0] = end - begin;
    slices.push_back(std::move(slice));
  }
  return slices;
}

Result<io::Marker> BuildPlan(const std::vector<RankDescription>& ranks,
                             uint64_t replica_parallel_min_bytes) {
  const int world = static_cast<int>(ranks.size());
  for (const RankDescription& r : ranks) {
    if (!r.status.ok()) return r.status;
  }
  for (int r = 1; r < world; ++r) {
    if (ranks[r].step != ranks[0].step) {
      return InvalidArgument(
          fmt::format("ranks disagree on the step: rank 0 saves step {}, rank {} step {}",
                      ranks[0].step, r, ranks[r].step));
    }
  }

  // Index every rank's arrays by name; rank 0's list is the reference.
  std::map<std::string, const ArrayDescription*> reference;
  for (const ArrayDescription& a : ranks[0].arrays) reference[a.name] = &a;
  std::map<std::string, std::vector<Holding>> holdings;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, const ArrayDescription*> mine;
    for (const ArrayDescription& a : ranks[r].arrays) mine[a.name] = &a;
    for (const auto& [name, a] : mine) {
      auto it = reference.find(name);
      if (it == reference.end()) {
        return InvalidArgument(
            fmt::format("array '{}' is saved by rank {} but not by rank 0", name, r));
      }
      const ArrayDescription& ref = *it->second;
      if (a->dtype != ref.dtype || a->shape != ref.shape) {
        return InvalidArgument(fmt::format("array '{}': rank {} says {} {}, rank 0 says {} {}",
                                           name, r, DTypeName(a->dtype), ShapeToString(a->shape),
                                           DTypeName(ref.dtype), ShapeToString(ref.shape)));
      }
      std::vector<Holding>& hs = holdings[name];
      for (const Box& b : a->boxes) {
        if (Volume(b.count).value_or(0) == 0) continue;  // nothing to write
        auto h = std::find_if(hs.begin(), hs.end(), [&](const Holding& x) { return x.box == b; });
        if (h == hs.end()) {
          hs.push_back(
              Holding{b, {}, *Volume(b.count) * static_cast<int64_t>(DTypeSize(a->dtype))});
          h = hs.end() - 1;
        }
        if (h->holders.empty() || h->holders.back() != r) h->holders.push_back(r);
      }
    }
    if (mine.size() != reference.size()) {
      for (const auto& [name, a] : reference) {
        if (!mine.count(name)) {
          return InvalidArgument(
              fmt::format("array '{}' is saved by rank 0 but not by rank {}", name, r));
        }
      }
    }
  }

  io::Marker plan;
  plan.step = ranks[0].step;
  plan.world_size = world;
  for (const auto& [name, ref] : reference) {
    for (size_t p = name.find('/'); p != std::string::npos; p = name.find('/', p + 1)) {
      if (reference.count(name.substr(0, p))) {
        return InvalidArgument(
            fmt::format("array '{}' is inside array '{}': a name cannot be both "
                        "an array and a group",
                        name, name.substr(0, p)));
      }
    }
    std::vector<Holding>& hs = holdings[name];
    std::sort(hs.begin(), hs.end(),
              [](const Holding& a, const Holding& b) { return a.box < b.box; });
    MHCKPT_RETURN_IF_ERROR(CheckTiling(name, ref->shape, hs));
  }

  // Writers: single holders first, then the shared boxes to the least loaded holder.
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (auto& [name, hs] : holdings) {
    for (const Holding& h : hs) {
      if (h.holders.size() == 1) load[static_cast<size_t>(h.holders[0])] += h.bytes;
    }
  }
  for (const auto& [name, ref] : reference) {
    io::MarkerArray ma{name, ref->dtype, ref->shape, false, {}};
    const std::vector<Holding>& hs = holdings[name];
    ma.replicated = hs.size() == 1 && hs[0].box == FullBox(ref->shape);
    for (const Holding& h : hs) {
      // Replica-parallel: a big shared box goes out in row slices, one per
      // holder in rank order (every holder staged the whole box).
      if (replica_parallel_min_bytes > 0 && h.holders.size() > 1 &&
          static_cast<uint64_t>(h.bytes) >= replica_parallel_min_bytes && !h.box.count.empty() &&
          h.box.count[0] >= 2) {
        const std::vector<Box> slices = SplitRows(h.box, static_cast<int>(h.holders.size()));
        const int64_t row_bytes = h.bytes / h.box.count[0];
        for (size_t i = 0; i < slices.size(); ++i) {
          const int writer = h.holders[i];
          load[static_cast<size_t>(writer)] += slices[i].count[0] * row_bytes;
          ma.boxes.push_back(io::MarkerBox{slices[i], writer});
        }
        plan.total_bytes += static_cast<uint64_t>(h.bytes);
        continue;
      }
      int writer = h.holders[0];
      if (h.holders.size() > 1) {
        if (!(ma.replicated && writer == 0)) {
          for (int r : h.holders) {
            if (load[static_cast<size_t>(r)] < load[static_cast<size_t>(writer)]) writer = r;
          }
        }
        load[static_cast<size_t>(writer)] += h.bytes;
      }
      ma.boxes.push_back(io::MarkerBox{h.box, writer});
      plan.total_bytes += static_cast<uint64_t>(h.bytes);
    }
    plan.arrays.push_back(std::move(ma));
  }
  return plan;
}

}  // namespace mhckpt
