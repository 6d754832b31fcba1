#include "coordinator/plan.h"

#include <xxhash.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mhckpt::internal {
namespace {

using nlohmann::json;

struct Holding {
  Box box;
  std::vector<int> holders;  // ascending ranks
  int64_t bytes = 0;
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

RankDescription Describe(int64_t step, const Status& local, const Snapshot& snapshot) {
  RankDescription d{step, local, {}};
  if (!local.ok()) return d;  // the plan fails with the error; the arrays do not matter
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

namespace {

// What a description must hold for BuildPlan to read it safely: codes and
// dtypes inside their enums, shapes with a volume, boxes inside them. A
// rank's own snapshot guarantees all of it; this checks what arrived.
std::string CheckDecoded(const ArrayDescription& a) {
  if (!IsValidDType(a.dtype)) return fmt::format("dtype {}", static_cast<int>(a.dtype));
  if (a.shape.size() > kMaxDims || !Volume(a.shape)) return "shape " + ShapeToString(a.shape);
  for (const Box& b : a.boxes) {
    if (std::string why = CheckBoxInShape(b, a.shape); !why.empty()) {
      return fmt::format("box {}: {}", BoxToString(b), why);
    }
  }
  return {};
}

}  // namespace

Result<RankDescription> DecodeDescription(const std::string& bytes) {
  try {
    json j = json::from_cbor(bytes);
    RankDescription d;
    d.step = j.at(0).get<int64_t>();
    std::optional<StatusCode> code = StatusCodeFromInt(j.at(1).get<int64_t>());
    if (!code) {
      return Internal(
          fmt::format("a rank's description has the unknown status code {}", j.at(1).dump()));
    }
    d.status = Status(*code, j.at(2).get<std::string>());
    for (const json& ja : j.at(3)) {
      const auto dtype = ja.at(1).get<int64_t>();
      ArrayDescription a{ja.at(0).get<std::string>(),
                         dtype >= 0 && dtype < kNumDTypes ? static_cast<DType>(dtype)
                                                          : static_cast<DType>(kNumDTypes),
                         ja.at(2).get<std::vector<int64_t>>(),
                         {}};
      for (const json& jb : ja.at(3)) {
        a.boxes.push_back(
            Box{jb.at(0).get<std::vector<int64_t>>(), jb.at(1).get<std::vector<int64_t>>()});
      }
      if (std::string why = CheckDecoded(a); !why.empty()) {
        return Internal(fmt::format("a rank's description of array '{}' is damaged: {}",
                                    QuoteForMessage(a.name), why));
      }
      d.arrays.push_back(std::move(a));
    }
    return d;
  } catch (const json::exception& e) {
    return Internal(fmt::format("cannot decode a rank's description: {}", e.what()));
  }
}

uint64_t DescriptionHash(const Snapshot& snapshot) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) {  // no memory for the streaming state: hash the encoded form
    std::string bytes = EncodeDescription(Describe(0, OkStatus(), snapshot));
    return XXH3_64bits(bytes.data(), bytes.size());
  }
  XXH3_64bits_reset(state);
  // Every field is preceded by its length, so different holdings give
  // different byte streams.
  auto add = [&](const void* p, size_t n) { XXH3_64bits_update(state, p, n); };
  auto add_size = [&](uint64_t n) { add(&n, sizeof n); };
  auto add_ints = [&](const std::vector<int64_t>& v) {
    add_size(v.size());
    add(v.data(), v.size() * sizeof(int64_t));
  };
  add_size(snapshot.arrays.size());
  for (const StagedArray& a : snapshot.arrays) {
    add_size(a.name.size());
    add(a.name.data(), a.name.size());
    add_size(static_cast<uint64_t>(a.dtype));
    add_ints(a.shape);
    add_size(a.boxes.size());
    for (const StagedBox& b : a.boxes) {
      add_ints(b.box.start);
      add_ints(b.box.count);
    }
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
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
Status CheckRanks(const std::vector<RankDescription>& ranks) {
  for (const RankDescription& r : ranks) {
    if (!r.status.ok()) return r.status;
  }
  for (size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r].step != ranks[0].step) {
      return InvalidArgument(
          fmt::format("ranks disagree on the step: rank 0 saves step {}, rank {} step {}",
                      ranks[0].step, r, ranks[r].step));
    }
  }
  return OkStatus();
}

// Adds the non-empty boxes of `a`, held by rank `r`, to `hs`: each distinct
// box once, with every rank that holds it.
void AddBoxes(const ArrayDescription& a, int r, std::vector<Holding>* hs) {
  for (const Box& b : a.boxes) {
    if (Volume(b.count).value_or(0) == 0) continue;  // nothing to write
    auto h = std::find_if(hs->begin(), hs->end(), [&](const Holding& x) { return x.box == b; });
    if (h == hs->end()) {
      hs->push_back(Holding{b, {}, *Volume(b.count) * static_cast<int64_t>(DTypeSize(a.dtype))});
      h = hs->end() - 1;
    }
    if (h->holders.empty() || h->holders.back() != r) h->holders.push_back(r);
  }
}

// Checks the arrays of rank `r` against rank 0's and adds their boxes.
Status AddRank(int r, const RankDescription& rank, const Reference& reference, Holdings* holdings) {
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
    AddBoxes(*a, r, &(*holdings)[name]);
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

// Replica-parallel saving: shared box `h` goes out in row slices, one per
// holder in rank order (every holder staged the whole box).
void AddSlices(const Holding& h, std::vector<int64_t>& load, io::MarkerArray* ma) {
  const std::vector<Box> slices = SplitRows(h.box, static_cast<int>(h.holders.size()));
  const int64_t row_bytes = h.bytes / h.box.count[0];
  for (size_t i = 0; i < slices.size(); ++i) {
    const int writer = h.holders[i];
    load[static_cast<size_t>(writer)] += slices[i].count[0] * row_bytes;
    ma->boxes.push_back(io::MarkerBox{slices[i], writer});
  }
}

// The planned boxes of one array, each with its writer. `load` holds the
// bytes given to each rank so far.
io::MarkerArray PlanArray(const std::string& name, const ArrayDescription& ref,
                          const std::vector<Holding>& hs, uint64_t replica_parallel_min_bytes,
                          std::vector<int64_t>& load) {
  io::MarkerArray ma{name, ref.dtype, ref.shape, false, {}};
  ma.replicated = hs.size() == 1 && hs[0].box == FullBox(ref.shape);
  for (const Holding& h : hs) {
    if (replica_parallel_min_bytes > 0 && h.holders.size() > 1 &&
        static_cast<uint64_t>(h.bytes) >= replica_parallel_min_bytes && !h.box.count.empty() &&
        h.box.count[0] >= 2) {
      AddSlices(h, load, &ma);
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
  }
  return ma;
}

}  // namespace

Result<io::Marker> BuildPlan(const std::vector<RankDescription>& ranks,
                             uint64_t replica_parallel_min_bytes) {
  const int world = static_cast<int>(ranks.size());
  MHCKPT_RETURN_IF_ERROR(CheckRanks(ranks));
  Reference reference;
  for (const ArrayDescription& a : ranks[0].arrays) reference[a.name] = &a;
  Holdings holdings;
  for (int r = 0; r < world; ++r) {
    MHCKPT_RETURN_IF_ERROR(AddRank(r, ranks[static_cast<size_t>(r)], reference, &holdings));
  }
  MHCKPT_RETURN_IF_ERROR(CheckArrays(reference, &holdings));

  io::Marker plan;
  plan.step = ranks[0].step;
  plan.world_size = world;
  // Writers: single holders first, then the shared boxes to the least loaded holder.
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (auto& [name, hs] : holdings) {
    for (const Holding& h : hs) {
      if (h.holders.size() == 1) load[static_cast<size_t>(h.holders[0])] += h.bytes;
    }
  }
  for (const auto& [name, ref] : reference) {
    const std::vector<Holding>& hs = holdings[name];
    for (const Holding& h : hs) plan.total_bytes += static_cast<uint64_t>(h.bytes);
    plan.arrays.push_back(PlanArray(name, *ref, hs, replica_parallel_min_bytes, load));
  }
  return plan;
}

}  // namespace mhckpt::internal
