#include "coordinator/plan.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include <fmt/format.h>

namespace mhckpt::internal {
namespace {
struct Holding {
  Box box;
  std::vector<int> holders;  // ascending ranks
  int64_t bytes = 0;
  std::vector<io::MarkerBox> planned;  // the box or its row slices, each with its writer
};

// The distinct non-empty boxes of every array, by name.
using Holdings = std::map<std::string, std::vector<Holding>>;
// Every array by name, as rank 0 described it: the reference for all ranks.
using Reference = std::map<std::string, const ArrayDescription*>;

}  // namespace

Status CheckTiling(const std::string& name, const std::vector<int64_t>& shape,
                   std::vector<RankedBox> boxes) {
  int64_t covered = 0;
  for (const RankedBox& b : boxes) covered += Volume(b.box->count).value_or(0);
  if (!shape.empty()) {
    // A sweep over the boxes sorted by their start in dimension 0.
    std::sort(boxes.begin(), boxes.end(), [](const RankedBox& a, const RankedBox& b) {
      return a.box->start[0] < b.box->start[0];
    });
    for (size_t i = 0; i < boxes.size(); ++i) {
      const Box& a = *boxes[i].box;
      for (size_t j = i + 1; j < boxes.size() && boxes[j].box->start[0] < a.start[0] + a.count[0];
           ++j) {
        const Box& b = *boxes[j].box;
        if (BoxesIntersect(a, b)) {
          return InvalidArgument(
              fmt::format("array '{}': box {} (rank {}) and box {} (rank {}) overlap partially",
                          name, BoxToString(a), boxes[i].rank, BoxToString(b), boxes[j].rank));
        }
      }
    }
  }
  const int64_t volume = Volume(shape).value_or(0);
  if (covered != volume) {
    return InvalidArgument(fmt::format(
        "array '{}' of shape {}: the boxes of all ranks cover {} of {} elements (holes)", name,
        ShapeToString(shape), covered, volume));
  }
  return OkStatus();
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

std::optional<std::pair<size_t, size_t>> RowRunBytes(const Box& whole, const Box& part,
                                                     size_t whole_bytes) {
  const size_t dims = whole.count.size();
  if (dims == 0 || part.count.size() != dims || whole.count[0] <= 0) return std::nullopt;
  if (!std::equal(whole.start.begin() + 1, whole.start.end(), part.start.begin() + 1) ||
      !std::equal(whole.count.begin() + 1, whole.count.end(), part.count.begin() + 1) ||
      part.start[0] < whole.start[0] ||
      part.start[0] + part.count[0] > whole.start[0] + whole.count[0]) {
    return std::nullopt;
  }
  const size_t row_bytes = whole_bytes / static_cast<size_t>(whole.count[0]);
  return std::pair{static_cast<size_t>(part.start[0] - whole.start[0]) * row_bytes,
                   static_cast<size_t>(part.count[0]) * row_bytes};
}

namespace {
// A rank's own error (the lowest rank's), then ranks disagreeing on the step.
// Rank r described `layouts[of[r]]`.
Status CheckRanks(const std::vector<RankDescription>& layouts, const std::vector<int>& of) {
  for (int l : of) {
    if (l < 0 || static_cast<size_t>(l) >= layouts.size()) {
      return Internal(fmt::format("plan: layout {} of {} does not exist", l, layouts.size()));
    }
  }
  for (int l : of) {
    if (!layouts[static_cast<size_t>(l)].status.ok()) return layouts[static_cast<size_t>(l)].status;
  }
  const int64_t step = layouts[static_cast<size_t>(of[0])].step;
  for (size_t r = 1; r < of.size(); ++r) {
    if (layouts[static_cast<size_t>(of[r])].step != step) {
      return InvalidArgument(
          fmt::format("ranks disagree on the step: rank 0 saves step {}, rank {} step {}", step, r,
                      layouts[static_cast<size_t>(of[r])].step));
    }
  }
  return OkStatus();
}

// Where a layout's non-empty boxes sit in the holdings: the array's distinct
// boxes, and an index into them (stable: they are sorted only once every rank
// is in).
using Slots = std::vector<std::pair<std::vector<Holding>*, size_t>>;

// Adds the non-empty boxes of `a` to `hs` (each distinct box once) and their
// places to `slots`.
void AddBoxes(const ArrayDescription& a, std::vector<Holding>* hs, Slots* slots) {
  for (const Box& b : a.boxes) {
    if (Volume(b.count).value_or(0) == 0) continue;  // nothing to write
    auto h = std::find_if(hs->begin(), hs->end(), [&](const Holding& x) { return x.box == b; });
    if (h == hs->end()) {
      hs->push_back(
          Holding{b, {}, *Volume(b.count) * static_cast<int64_t>(DTypeSize(a.dtype)), {}});
      h = hs->end() - 1;
    }
    slots->emplace_back(hs, static_cast<size_t>(h - hs->begin()));
  }
}

// Checks the arrays of a layout, first described by rank `r`, against rank
// 0's and adds their boxes; `slots` gets where they sit.
Status AddLayout(int r, const RankDescription& rank, const Reference& reference, Holdings* holdings,
                 Slots* slots) {
  Reference mine;
  for (const ArrayDescription& a : rank.arrays) mine[a.name] = &a;
  for (const auto& [name, a] : mine) {
    auto it = reference.find(name);
    if (it == reference.end()) {
      return InvalidArgument(
          fmt::format("array '{}' is saved by rank {} but not by rank 0", name, r));
    }
    const ArrayDescription& ref = *it->second;
    if (a->dtype != ref.dtype || a->shape != ref.shape) {
      return InvalidArgument(fmt::format("array '{}': rank {} says {} {}, rank 0 says {} {}", name,
                                         r, DTypeName(a->dtype), ShapeToString(a->shape),
                                         DTypeName(ref.dtype), ShapeToString(ref.shape)));
    }
    AddBoxes(*a, &(*holdings)[name], slots);
  }
  if (mine.size() != reference.size()) {
    for (const auto& [name, a] : reference) {
      if (!mine.count(name)) {
        return InvalidArgument(
            fmt::format("array '{}' is saved by rank 0 but not by rank {}", name, r));
      }
    }
  }
  return OkStatus();
}

// Every rank's boxes into `holdings`: each layout checked once (naming the
// lowest rank that described it), then every rank added as a holder of its
// layout's boxes. Ranks go in ascending order, so holders are ascending.
Status AddRanks(const std::vector<RankDescription>& layouts, const std::vector<int>& of,
                const Reference& reference, Holdings* holdings) {
  std::vector<Slots> slots(layouts.size());
  std::vector<bool> seen(layouts.size(), false);
  for (size_t r = 0; r < of.size(); ++r) {
    const auto l = static_cast<size_t>(of[r]);
    if (!seen[l]) {
      seen[l] = true;
      MHCKPT_RETURN_IF_ERROR(
          AddLayout(static_cast<int>(r), layouts[l], reference, holdings, &slots[l]));
    }
    for (auto [hs, i] : slots[l]) {
      std::vector<int>& holders = (*hs)[i].holders;
      if (holders.empty() || holders.back() != static_cast<int>(r)) {
        holders.push_back(static_cast<int>(r));
      }
    }
  }
  return OkStatus();
}

// No name is both an array and a group, and the boxes of every array tile
// it. Sorts each array's boxes.
Status CheckArrays(const Reference& reference, Holdings* holdings) {
  for (const auto& [name, ref] : reference) {
    for (size_t p = name.find('/'); p != std::string::npos; p = name.find('/', p + 1)) {
      if (reference.count(name.substr(0, p))) {
        return InvalidArgument(
            fmt::format("array '{}' is inside array '{}': a name cannot be both "
                        "an array and a group",
                        name, name.substr(0, p)));
      }
    }
    std::vector<Holding>& hs = (*holdings)[name];
    std::sort(hs.begin(), hs.end(),
              [](const Holding& a, const Holding& b) { return a.box < b.box; });
    std::vector<RankedBox> boxes;
    boxes.reserve(hs.size());
    for (const Holding& h : hs) boxes.push_back({&h.box, h.holders.front()});
    MHCKPT_RETURN_IF_ERROR(CheckTiling(name, ref->shape, std::move(boxes)));
  }
  return OkStatus();
}

// Replica-parallel saving: how many row slices shared box `h` is cut into —
// one per holder, at most one per row, and none under `min_bytes` unless
// that leaves fewer than 2. 1: not cut.
int64_t SliceCount(const Holding& h, uint64_t min_bytes) {
  if (min_bytes == 0 || h.holders.size() < 2 || static_cast<uint64_t>(h.bytes) < min_bytes ||
      h.box.count.empty() || h.box.count[0] < 2) {
    return 1;
  }
  const auto by_size = std::max<int64_t>(2, h.bytes / static_cast<int64_t>(min_bytes));
  return std::min({static_cast<int64_t>(h.holders.size()), h.box.count[0], by_size});
}

// The `n` least loaded of `holders` (lowest rank on ties), in rank order.
std::vector<int> LeastLoaded(const std::vector<int>& holders, size_t n,
                             const std::vector<int64_t>& load) {
  std::vector<int> pick = holders;
  if (n < pick.size()) {
    auto less = [&](int a, int b) {
      return std::pair(load[static_cast<size_t>(a)], a) <
             std::pair(load[static_cast<size_t>(b)], b);
    };
    std::nth_element(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(n) - 1, pick.end(),
                     less);
    std::partial_sort(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(n), pick.end(),
                      less);
    pick.resize(n);
    std::sort(pick.begin(), pick.end());
  }
  return pick;
}

// Writes shared box `h` out in row slices, slice i by the i-th of the least
// loaded holders in rank order (every holder staged the whole box).
void PlanSlices(Holding* h, int64_t n, std::vector<int64_t>& load) {
  const std::vector<int> writers = LeastLoaded(h->holders, static_cast<size_t>(n), load);
  const std::vector<Box> slices = SplitRows(h->box, static_cast<int>(n));
  const int64_t row_bytes = h->bytes / h->box.count[0];
  for (size_t i = 0; i < slices.size(); ++i) {
    load[static_cast<size_t>(writers[i])] += slices[i].count[0] * row_bytes;
    h->planned.push_back(io::MarkerBox{slices[i], writers[i], 0, 0, {}});
  }
}

// The writers of every box. Single holders write their boxes; the shared
// boxes then go out largest first (ties in name and box order), each to its
// least loaded holder — or rank 0 for a replicated array it holds — or in
// slices (replica-parallel saving).
void PlanWriters(Holdings& holdings, const Reference& reference,
                 uint64_t replica_parallel_min_bytes, std::vector<int64_t>& load) {
  std::vector<std::pair<Holding*, bool>> shared;  // and whether its array is replicated
  for (auto& [name, hs] : holdings) {
    const bool replicated = hs.size() == 1 && hs[0].box == FullBox(reference.at(name)->shape);
    for (Holding& h : hs) {
      if (h.holders.size() > 1) {
        shared.emplace_back(&h, replicated);
        continue;
      }
      load[static_cast<size_t>(h.holders[0])] += h.bytes;
      h.planned.push_back(io::MarkerBox{h.box, h.holders[0], 0, 0, {}});
    }
  }
  std::stable_sort(shared.begin(), shared.end(),
                   [](const auto& a, const auto& b) { return a.first->bytes > b.first->bytes; });
  for (auto [h, replicated] : shared) {
    if (const int64_t n = SliceCount(*h, replica_parallel_min_bytes); n > 1) {
      PlanSlices(h, n, load);
      continue;
    }
    int writer = h->holders[0];
    if (!(replicated && writer == 0)) writer = LeastLoaded(h->holders, 1, load)[0];
    load[static_cast<size_t>(writer)] += h->bytes;
    h->planned.push_back(io::MarkerBox{h->box, writer, 0, 0, {}});
  }
}

// The planned boxes of one array, each with its writer, in box order.
io::MarkerArray PlanArray(const std::string& name, const ArrayDescription& ref,
                          std::vector<Holding>& hs) {
  io::MarkerArray ma{name, ref.dtype, ref.shape, false, {}};
  ma.replicated = hs.size() == 1 && hs[0].box == FullBox(ref.shape);
  for (Holding& h : hs) {
    for (io::MarkerBox& b : h.planned) ma.boxes.push_back(std::move(b));
  }
  return ma;
}

}  // namespace

Result<io::Marker> BuildPlan(const std::vector<RankDescription>& ranks,
                             uint64_t replica_parallel_min_bytes, uint64_t chunk_bytes) {
  std::vector<int> of(ranks.size());
  for (size_t r = 0; r < of.size(); ++r) of[r] = static_cast<int>(r);
  return BuildPlan(ranks, of, replica_parallel_min_bytes, chunk_bytes);
}

Result<io::Marker> BuildPlan(const std::vector<RankDescription>& layouts,
                             const std::vector<int>& layout_of_rank,
                             uint64_t replica_parallel_min_bytes, uint64_t chunk_bytes) {
  const int world = static_cast<int>(layout_of_rank.size());
  if (world == 0) return Internal("plan: no ranks");
  MHCKPT_RETURN_IF_ERROR(CheckRanks(layouts, layout_of_rank));
  const RankDescription& first = layouts[static_cast<size_t>(layout_of_rank[0])];
  Reference reference;
  for (const ArrayDescription& a : first.arrays) reference[a.name] = &a;
  Holdings holdings;
  MHCKPT_RETURN_IF_ERROR(AddRanks(layouts, layout_of_rank, reference, &holdings));
  MHCKPT_RETURN_IF_ERROR(CheckArrays(reference, &holdings));

  io::Marker plan;
  plan.step = first.step;
  plan.world_size = world;
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  PlanWriters(holdings, reference, replica_parallel_min_bytes, load);
  for (const auto& [name, ref] : reference) {
    std::vector<Holding>& hs = holdings[name];
    for (const Holding& h : hs) plan.total_bytes += static_cast<uint64_t>(h.bytes);
    plan.arrays.push_back(PlanArray(name, *ref, hs));
  }
  // Each writer fills in its boxes' chunk checksums while writing (save.cc).
  io::PlanChunks(&plan, chunk_bytes > 0 ? chunk_bytes : io::kChunkBytes);
  return plan;
}

}  // namespace mhckpt::internal
