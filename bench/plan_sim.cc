// mhckpt-plan-sim: the plan round of a save at N ranks, simulated in one
// process with the library's own code (coordinator/plan.h, layouts.h,
// io/marker.h), for a transformer laid out with tensor (TP), pipeline (PP)
// and data parallelism (DP) at 8 GPUs per node (docs/SCALE.md).
//
//   build/bin/mhckpt-plan-sim --model 70b --ranks 8000 --arrays 10000 --json out.json
//   build/bin/mhckpt-plan-sim --model 70b --ranks 1000 --arrays 10000 --full
//
// What it does, in order:
//   1. Builds every rank's description (RankDescription) of the model's arrays
//      — 4 states per tensor (bf16 params, fp32 master, Adam m and v); --arrays
//      adds layers of the same shapes until there are that many — and
//      encodes it (EncodeDescription) and its digest (LayoutDigest), as each
//      rank does. Every rank names every array; a rank holds boxes only of
//      the arrays of its pipeline stage. Ranks at one TP x PP position hold
//      the same boxes: their description is built once and reused unless
//      --encode-every-rank (the digest is computed for every rank).
//   2. Rank 0's part of the plan round as save.cc does it: groups the digests
//      (GroupLayouts), decodes the senders' descriptions and plans
//      (PlanLayouts: BuildPlan), writes the plan as JSON (MarkerToJson).
//      Timed (--reps times; the run with the least CPU time is reported), with
//      the peak of bytes allocated meanwhile (operator new counted).
//   3. One other rank's part: parsing the plan (ParseMarker).
//   4. The plan again with replica-parallel saving (--rp-min-bytes).
//   5. --full: the plan round without deduplication (every rank's description
//      gathered and decoded, BuildPlan over all), if the gathered bytes are
//      below --full-max-bytes; their size and the gather rounds always.
// Reported: times, peak bytes, bytes gathered, plan/marker size, boxes,
// writer balance (max/mean bytes per rank, and per writing rank) and the
// parallel-HDF5 metadata operations of one save and one restore.
#include <malloc.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/gather_rounds.h"
#include "bench/bench_util.h"
#include "coordinator/layouts.h"
#include "coordinator/plan.h"
#include "coordinator/rank_report.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/step_index.h"
#include "programs/main_guard.h"

// ---- Every allocation counted, so rank 0's peak is measured, not guessed ----
namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void* Counted(size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  const int64_t live = g_live += static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void Uncounted(void* p) {
  if (p == nullptr) return;
  g_live -= static_cast<int64_t>(malloc_usable_size(p));
  std::free(p);
}
}  // namespace

void* operator new(size_t n) { return Counted(n); }
void* operator new[](size_t n) { return Counted(n); }
void operator delete(void* p) noexcept { Uncounted(p); }
void operator delete[](void* p) noexcept { Uncounted(p); }
void operator delete(void* p, size_t) noexcept { Uncounted(p); }
void operator delete[](void* p, size_t) noexcept { Uncounted(p); }

namespace mhckpt::bench {
namespace {

using internal::RankDescription;
using json = nlohmann::json;

// CPU time of this thread: on a loaded machine, the work without the waiting.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Bytes allocated at the peak since the last Mark(), beyond what was live then.
struct PeakMeter {
  int64_t base = 0;
  void Mark() {
    base = g_live.load();
    g_peak.store(base);
  }
  [[nodiscard]] int64_t Peak() const { return g_peak.load() - base; }
};

struct Model {
  std::string name;
  int64_t layers, hidden, ffn, vocab, kv;
  int tp, pp;
};

// Llama-3-like shapes; the default parallelism of each at 8 GPUs per node.
Model FindModel(const std::string& name) {
  if (name == "70b") return {"70b", 80, 8192, 28672, 128256, 1024, 8, 4};
  if (name == "400b") return {"400b", 126, 16384, 53248, 128256, 1024, 8, 8};
  if (name == "tiny") return {"tiny", 4, 64, 256, 512, 16, 2, 2};
  throw std::invalid_argument("unknown model " + name);
}

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int shard_dim;  // split over TP along this dimension; -1: every TP rank holds it whole
  int stage;      // the pipeline stage holding it
};

// The arrays of the model: 4 states of each tensor. Layers of the same shapes
// are added until there are `target` arrays (0: the model's own layers).
std::vector<Tensor> BuildTensors(const Model& m, int64_t target) {
  struct Part {
    const char* name;
    std::vector<int64_t> shape;
    int dim;
  };
  const std::vector<Part> layer = {{"attn/q", {m.hidden, m.hidden}, 0},
                                   {"attn/k", {m.kv, m.hidden}, 0},
                                   {"attn/v", {m.kv, m.hidden}, 0},
                                   {"attn/o", {m.hidden, m.hidden}, 1},
                                   {"mlp/gate", {m.ffn, m.hidden}, 0},
                                   {"mlp/up", {m.ffn, m.hidden}, 0},
                                   {"mlp/down", {m.hidden, m.ffn}, 1},
                                   {"norm1", {m.hidden}, -1},
                                   {"norm2", {m.hidden}, -1}};
  const int64_t per_layer = 4 * static_cast<int64_t>(layer.size());
  const int64_t layers =
      target > 0 ? std::max<int64_t>(1, (target - 12 + per_layer - 1) / per_layer) : m.layers;
  std::vector<std::pair<std::string, DType>> states = {{"params", DType::kBFloat16},
                                                       {"master", DType::kFloat32},
                                                       {"adam_m", DType::kFloat32},
                                                       {"adam_v", DType::kFloat32}};
  std::vector<Tensor> out;
  for (const auto& [state, dtype] : states) {
    out.push_back({state + "/embed", dtype, {m.vocab, m.hidden}, 0, 0});
    for (int64_t l = 0; l < layers; ++l) {
      const int stage = static_cast<int>(l * m.pp / layers);
      for (const Part& p : layer) {
        out.push_back(
            {fmt::format("{}/layer{}/{}", state, l, p.name), dtype, p.shape, p.dim, stage});
      }
    }
    out.push_back({state + "/final_norm", dtype, {m.hidden}, -1, m.pp - 1});
    out.push_back({state + "/lm_head", dtype, {m.vocab, m.hidden}, 0, m.pp - 1});
  }
  return out;
}

// What rank `rank` holds: TP fastest (one TP group per node), then PP, then DP.
RankDescription DescribeRank(const std::vector<Tensor>& tensors, const Model& m, int rank) {
  const int tp = rank % m.tp, stage = (rank / m.tp) % m.pp;
  RankDescription d;
  d.step = 1;
  d.arrays.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    internal::ArrayDescription a{t.name, t.dtype, t.shape, {}};
    if (t.stage == stage) {
      Box b = FullBox(t.shape);
      if (t.shard_dim >= 0) {
        auto [begin, end] = SplitRange(t.shape[static_cast<size_t>(t.shard_dim)], m.tp, tp);
        b.start[static_cast<size_t>(t.shard_dim)] = begin;
        b.count[static_cast<size_t>(t.shard_dim)] = end - begin;
      }
      a.boxes.push_back(std::move(b));
    }
    d.arrays.push_back(std::move(a));
  }
  return d;
}

// Bytes each rank writes under `plan`; max over ranks, mean over all ranks and
// over the ranks that write anything.
json Balance(const io::Marker& plan) {
  std::vector<double> bytes(static_cast<size_t>(plan.world_size), 0);
  size_t boxes = 0;
  for (const io::MarkerArray& a : plan.arrays) {
    for (const io::MarkerBox& b : a.boxes) {
      bytes[static_cast<size_t>(b.writer)] +=
          static_cast<double>(Volume(b.box.count).value_or(0)) * DTypeSize(a.dtype);
      ++boxes;
    }
  }
  double total = 0, largest = 0;
  int writers = 0;
  for (double b : bytes) {
    total += b;
    largest = std::max(largest, b);
    writers += b > 0 ? 1 : 0;
  }
  const double mean = total / static_cast<double>(bytes.size());
  const double mean_writers = writers > 0 ? total / writers : 0;
  return {{"boxes", boxes},
          {"writers", writers},
          {"max_bytes", largest},
          {"mean_bytes", mean},
          {"max_over_mean", mean > 0 ? largest / mean : 0},
          {"max_over_mean_of_writers", mean_writers > 0 ? largest / mean_writers : 0}};
}

// Parallel-HDF5 metadata operations (collective over all ranks) of one save
// and one restore of `plan`, as io/h5_file.cc makes them.
json MetadataOps(const io::Marker& plan) {
  std::set<std::string> groups;
  int64_t attributes = 0;
  for (const io::MarkerArray& a : plan.arrays) {
    for (size_t p = a.name.find('/'); p != std::string::npos; p = a.name.find('/', p + 1)) {
      groups.insert(a.name.substr(0, p));
    }
    if (DTypeStoredAsRawBits(a.dtype)) ++attributes;
  }
  const auto arrays = static_cast<int64_t>(plan.arrays.size());
  // Save: create file, groups, datasets (+ dtype attribute), close datasets,
  // flush, close. Restore: open file, open and close datasets, close.
  const int64_t save = 1 + static_cast<int64_t>(groups.size()) + 2 * arrays + attributes + 2;
  return {{"save", save},
          {"restore", 2 + 2 * arrays},
          {"groups", groups.size()},
          {"collective_writes_per_save", arrays}};
}

struct Flags {
  std::string model = "70b";
  int ranks = 64;
  int64_t arrays = 0;
  int tp = 0, pp = 0;
  uint64_t rp_min_bytes = 1 << 20;
  uint64_t chunk_bytes = io::kChunkBytes;
  bool full = false;
  bool every_rank = false;
  int reps = 3;
  int64_t full_max_bytes = int64_t{3} << 30;
  std::string json_path;
  std::string index_dir = "/tmp";
};

// What reaches rank 0 in the deduplicated plan round (step 1).
struct Gathered {
  std::vector<std::string> digests;  // every rank's
  std::vector<std::string> sent;     // index = rank; only the first of each layout's
  std::vector<int64_t> sizes;        // every rank's encoded description, in bytes
  double encode_seconds = 0;         // per rank (the slowest): describe, encode, digest
};

// Rank r's encoded description. Ranks at the same TP and PP position hold the
// same boxes, so unless `every_rank`, each position is built and encoded once
// (its cost is per rank, in parallel, in a real job) and the bytes reused.
class Encoder {
 public:
  Encoder(const std::vector<Tensor>& tensors, const Model& m, bool every_rank)
      : tensors_(tensors),
        m_(m),
        every_rank_(every_rank),
        memo_(static_cast<size_t>(m.tp * m.pp)) {}

  const std::string& Encode(int rank, double* seconds) {
    const auto position = static_cast<size_t>(rank % (m_.tp * m_.pp));
    if (every_rank_ || memo_[position].empty()) {
      auto t0 = Clock::now();
      memo_[position] = internal::EncodeDescription(DescribeRank(tensors_, m_, rank));
      *seconds = Since(t0);
    }
    return memo_[position];
  }

 private:
  const std::vector<Tensor>& tensors_;
  const Model& m_;
  bool every_rank_;
  std::vector<std::string> memo_;
};

Gathered SimulateRanks(Encoder& encoder, int ranks) {
  Gathered g;
  g.sent.resize(static_cast<size_t>(ranks));
  std::set<std::string> seen;
  double encode_seconds = 0, digest_seconds = 0;
  for (int r = 0; r < ranks; ++r) {
    double s = 0;
    const std::string& encoded = encoder.Encode(r, &s);
    encode_seconds = std::max(encode_seconds, s);
    auto t0 = Clock::now();
    g.digests.push_back(internal::LayoutDigest(encoded));
    digest_seconds += Since(t0);
    g.sizes.push_back(static_cast<int64_t>(encoded.size()));
    if (seen.insert(g.digests.back()).second) g.sent[static_cast<size_t>(r)] = encoded;
  }
  g.encode_seconds = encode_seconds + digest_seconds / ranks;
  return g;
}

// Whether every round of gathering `sizes` keeps MPI's int counts (the check
// of base/gather_rounds.h at this size), and how many rounds.
json GatherShape(const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  const internal::GatherRounds r = internal::PlanGatherRounds(sizes, internal::kGatherRoundBytes);
  bool fits = true;
  for (int64_t k = 0; k < r.rounds; ++k) fits = fits && internal::GatherRoundLayout(sizes, r, k);
  return {{"bytes", total}, {"rounds", r.rounds}, {"int_counts_fit", fits}};
}

// Rank 0's plan from the deduplicated round, timed and metered; then one other
// rank's parse of it.
json RootPlan(const Gathered& g, uint64_t rp_min_bytes, uint64_t chunk_bytes,
              io::Marker* plan_out) {
  PeakMeter meter;
  meter.Mark();
  const double cpu0 = ThreadCpuSeconds();
  auto t0 = Clock::now();
  const internal::LayoutGroups groups = internal::GroupLayouts(g.digests);
  const double group_s = Since(t0);
  Result<io::Marker> plan = internal::PlanLayouts(g.sent, groups, rp_min_bytes, chunk_bytes);
  if (!plan.ok()) throw std::runtime_error(plan.status().ToString());
  const double plan_s = Since(t0) - group_s;
  std::string text = io::MarkerToJson(*plan, io::MarkerText::kPlan);
  const double total_s = Since(t0);
  const double cpu_s = ThreadCpuSeconds() - cpu0;
  const int64_t peak = meter.Peak();
  // Of the plan's time: decoding the distinct descriptions (timed apart).
  const double decode_cpu0 = ThreadCpuSeconds();
  for (int r : groups.first_rank) {
    if (!internal::DecodeDescription(g.sent[static_cast<size_t>(r)]).ok()) {
      throw std::runtime_error("decode");
    }
  }
  const double decode_cpu = ThreadCpuSeconds() - decode_cpu0;
  auto t1 = Clock::now();
  Result<io::Marker> parsed = io::ParseMarker(text, "plan", io::MarkerText::kPlan);
  if (!parsed.ok()) throw std::runtime_error(parsed.status().ToString());
  const double parse_s = Since(t1);
  json out = {{"layouts", groups.first_rank.size()},
              {"group_seconds", group_s},
              {"plan_seconds", plan_s},
              {"root_seconds", total_s},
              {"root_cpu_seconds", cpu_s},
              {"decode_cpu_seconds", decode_cpu},
              {"root_peak_bytes", peak},
              {"plan_json_bytes", text.size()},
              {"plan_json_xxh3", XXH3_64bits(text.data(), text.size())},
              {"parse_seconds_per_rank", parse_s},
              {"balance", Balance(*plan)}};
  if (plan_out != nullptr) *plan_out = std::move(plan).value();
  return out;
}

// The writers' reports of a save of `plan` (index = rank), as save.cc sends
// them, with made-up checksums: format 2, each box's checksum and its
// chunks'; format 3, its index record's check word. Also the index file
// those writers would write, and each writer's share of it.
struct Reports {
  std::vector<std::string> v2, v3;
  std::string index;
  std::vector<uint64_t> index_bytes_of;  // per rank
};

Reports WriterReports(const io::Marker& plan, const io::IndexLayout& layout) {
  const auto world = static_cast<size_t>(plan.world_size);
  std::vector<std::vector<internal::BoxSum>> v2(world), v3(world);
  Reports r;
  r.index_bytes_of.assign(world, 0);
  r.index = io::IndexHeader(plan.step);
  r.index.reserve(layout.total());
  uint64_t sum = 1;
  for (size_t ai = 0; ai < plan.arrays.size(); ++ai) {
    for (size_t bi = 0; bi < plan.arrays[ai].boxes.size(); ++bi) {
      const io::MarkerBox& b = plan.arrays[ai].boxes[bi];
      std::vector<uint64_t> chunks(static_cast<size_t>(io::ChunkCount(b.box, b.chunk_rows)));
      for (uint64_t& c : chunks) c = sum++;
      const auto w = static_cast<size_t>(b.writer);
      std::optional<io::BoxPlace> place;  // with subfiles: one per node of 8 ranks
      if (plan.files > 0) place = io::BoxPlace{static_cast<uint64_t>(b.writer / 8), sum};
      const uint64_t check = io::AppendIndexRecord(ai, bi, sum, chunks, &r.index, place);
      v3[w].push_back({static_cast<uint32_t>(ai), static_cast<uint32_t>(bi), check, {}});
      v2[w].push_back(
          {static_cast<uint32_t>(ai), static_cast<uint32_t>(bi), sum++, std::move(chunks)});
      r.index_bytes_of[w] += layout.record_bytes(ai, bi);
    }
  }
  for (size_t w = 0; w < world; ++w) {
    r.v2.push_back(internal::EncodeReport(OkStatus(), v2[w]));
    r.v3.push_back(internal::EncodeReport(OkStatus(), v3[w]));
  }
  return r;
}

size_t TotalBytes(const std::vector<std::string>& v) {
  size_t n = 0;
  for (const std::string& s : v) n += s.size();
  return n;
}

// The stored boxes a rank at TP x PP position `rank` reads when it restores
// what it holds (a restore at the save's layout; another layout reads about
// as many).
std::vector<io::BoxRef> BoxesToRead(const io::Marker& plan, const RankDescription& d) {
  std::vector<io::BoxRef> refs;
  for (size_t ai = 0; ai < plan.arrays.size(); ++ai) {
    for (const Box& held : d.arrays[ai].boxes) {
      for (size_t bi = 0; bi < plan.arrays[ai].boxes.size(); ++bi) {
        if (BoxesIntersect(held, plan.arrays[ai].boxes[bi].box)) {
          refs.emplace_back(static_cast<uint32_t>(ai), static_cast<uint32_t>(bi));
        }
      }
    }
  }
  return refs;
}

json Format3(const io::Marker& plan3, const io::IndexLayout& layout, const Reports& r,
             const std::vector<Tensor>& tensors, const Model& m, const std::string& index_dir);

// The layout work of a save with subfiles (`plan.files` groups of 8 ranks),
// made with HDF5 in `dir`: rank 0's data.h5 of virtual datasets, one per
// array mapping every box onto its writer's subfile, and the busiest group's
// subfile, one dataset per box. Wall and CPU seconds, and the counts.
json SubfileLayout(const io::Marker& plan, const std::string& dir) {
  const std::string path = dir + "/mhckpt-plan-sim-data.h5";
  json out;
  {
    const double cpu0 = ThreadCpuSeconds();
    auto t0 = Clock::now();
    io::H5File f = io::H5File::CreateLocal(path, true).value();
    std::vector<io::H5File::VirtualSource> sources;
    size_t mappings = 0;
    for (size_t ai = 0; ai < plan.arrays.size(); ++ai) {
      const io::MarkerArray& a = plan.arrays[ai];
      sources.clear();
      for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
        sources.push_back({a.boxes[bi].box, io::SubfileName(a.boxes[bi].writer / 8),
                           fmt::format("/box_{}_{}", ai, bi)});
      }
      mappings += sources.size();
      Status s = f.CreateVirtualDataset(a.name, a.dtype, a.shape, sources);
      if (!s.ok()) throw std::runtime_error(s.ToString());
    }
    if (!f.Close().ok()) throw std::runtime_error("close " + path);
    out["root_virtual_datasets"] = plan.arrays.size();
    out["root_mappings"] = mappings;
    out["root_seconds"] = Since(t0);
    out["root_cpu_seconds"] = ThreadCpuSeconds() - cpu0;
    struct stat st {};
    out["data_h5_bytes"] = ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
    std::remove(path.c_str());
  }
  std::vector<size_t> per_group(static_cast<size_t>(plan.files), 0);
  for (const io::MarkerArray& a : plan.arrays) {
    for (const io::MarkerBox& b : a.boxes) ++per_group[static_cast<size_t>(b.writer / 8)];
  }
  const auto busiest =
      static_cast<int>(std::max_element(per_group.begin(), per_group.end()) - per_group.begin());
  {
    const double cpu0 = ThreadCpuSeconds();
    auto t0 = Clock::now();
    io::H5File f = io::H5File::CreateLocal(path).value();
    for (size_t ai = 0; ai < plan.arrays.size(); ++ai) {
      const io::MarkerArray& a = plan.arrays[ai];
      for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
        if (a.boxes[bi].writer / 8 != busiest) continue;
        Result<io::Dataset> d =
            f.CreateDataset(fmt::format("box_{}_{}", ai, bi), a.dtype, a.boxes[bi].box.count);
        if (!d.ok()) throw std::runtime_error(d.status().ToString());
      }
    }
    if (!f.Close().ok()) throw std::runtime_error("close " + path);
    out["group_datasets_max"] = per_group[static_cast<size_t>(busiest)];
    out["group_seconds"] = Since(t0);
    out["group_cpu_seconds"] = ThreadCpuSeconds() - cpu0;
    std::remove(path.c_str());
  }
  return out;
}

// The commit of `plan` (format 3, as planned) in both formats, measured with
// the library's code: what rank 0 gathers, does and writes per save, what
// each writer puts in the index, and one rank's restore metadata (the rank
// that reads the most of the index): bytes and the time to parse them.
json Commit(const io::Marker& plan3, const std::vector<Tensor>& tensors, const Model& m,
            const std::string& index_dir) {
  io::Marker plan2 = plan3;
  io::PlanChunks(&plan2, plan3.chunk_bytes, 2);
  const io::IndexLayout layout = io::IndexLayout::Of(plan3, "plan").value();
  const Reports r = WriterReports(plan3, layout);
  json out;
  {  // Format 2: every chunk's checksum to rank 0, into the marker.
    io::Marker marker = plan2;
    const double cpu0 = ThreadCpuSeconds();
    if (!internal::FillChecksums(r.v2, &marker).ok()) throw std::runtime_error("fill v2");
    const std::string text = io::MarkerToJson(marker);
    const double root_cpu = ThreadCpuSeconds() - cpu0;
    const double parse0 = ThreadCpuSeconds();
    if (!io::ParseMarker(text, "marker").ok()) throw std::runtime_error("parse v2");
    out["format2"] = {{"reports_bytes", TotalBytes(r.v2)},
                      {"root_commit_cpu_seconds", root_cpu},
                      {"marker_json_bytes", text.size()},
                      {"restore_metadata_bytes_per_rank", text.size()},
                      {"restore_parse_cpu_seconds_per_rank", ThreadCpuSeconds() - parse0}};
  }
  out["format3"] = Format3(plan3, layout, r, tensors, m, index_dir);
  // Subfiles, one per node of 8 ranks: the same with each box's place in
  // the index, and rank 0's and a group's layout work, made with HDF5.
  io::Marker sub = plan3;
  sub.files = (plan3.world_size + 7) / 8;
  const io::IndexLayout sub_layout = io::IndexLayout::Of(sub, "plan").value();
  out["subfiles_per_node"] =
      Format3(sub, sub_layout, WriterReports(sub, sub_layout), tensors, m, index_dir);
  out["subfiles_per_node"]["files"] = sub.files;
  out["subfiles_per_node"]["layout"] = SubfileLayout(sub, index_dir);
  return out;
}

// Format 3's commit of `plan3` (with its index `layout` and the writers'
// reports `r`) and the restore metadata of the rank that reads the most.
json Format3(const io::Marker& plan3, const io::IndexLayout& layout, const Reports& r,
             const std::vector<Tensor>& tensors, const Model& m, const std::string& index_dir) {
  // Format 3: a check word per box to rank 0; the records in the index.
  io::Marker marker = plan3;
  const double cpu0 = ThreadCpuSeconds();
  const io::IndexLayout root_layout = io::IndexLayout::Of(marker, "plan").value();
  if (!internal::FillIndex(r.v3, root_layout, &marker).ok()) throw std::runtime_error("fill v3");
  const std::string text = io::MarkerToJson(marker);
  const double root_cpu = ThreadCpuSeconds() - cpu0;
  const std::string path = index_dir + "/mhckpt-plan-sim-index.bin";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(r.index.data(), static_cast<std::streamsize>(r.index.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
  }
  // The rank that reads the most records: one per TP x PP position (data
  // parallel replicas read the same).
  std::vector<io::BoxRef> most;
  uint64_t most_bytes = 0;
  for (int p = 0; p < m.tp * m.pp && p < plan3.world_size; ++p) {
    std::vector<io::BoxRef> refs = BoxesToRead(plan3, DescribeRank(tensors, m, p));
    uint64_t bytes = 0;
    for (const io::BoxRef& b : refs) bytes += layout.record_bytes(b.first, b.second);
    if (bytes >= most_bytes) {
      most_bytes = bytes;
      most = std::move(refs);
    }
  }
  const double parse0 = ThreadCpuSeconds();
  auto t0 = Clock::now();
  Result<io::Marker> parsed = io::ParseMarker(text, "marker");
  if (!parsed.ok()) throw std::runtime_error(parsed.status().ToString());
  const double marker_parse = ThreadCpuSeconds() - parse0;
  const io::IndexLayout reader_layout = io::IndexLayout::Of(*parsed, "marker").value();
  uint64_t read = 0;
  Status loaded = io::LoadIndexRecords(path, reader_layout, most, &*parsed, &read);
  const double parse_cpu = ThreadCpuSeconds() - parse0;
  const double parse_wall = Since(t0);
  std::remove(path.c_str());
  if (!loaded.ok()) throw std::runtime_error(loaded.ToString());
  const uint64_t largest_share =
      *std::max_element(r.index_bytes_of.begin(), r.index_bytes_of.end());
  std::set<int> files;  // with subfiles: the ones that rank opens (8 ranks each)
  for (const io::BoxRef& b : most) {
    if (plan3.files > 0) files.insert(plan3.arrays[b.first].boxes[b.second].writer / 8);
  }
  return {{"restore_files_per_rank", plan3.files > 0 ? files.size() : 1},
          {"reports_bytes", TotalBytes(r.v3)},
          {"root_commit_cpu_seconds", root_cpu},
          {"marker_json_bytes", text.size()},
          {"index_bytes", layout.total()},
          {"index_writers", std::count_if(r.index_bytes_of.begin(), r.index_bytes_of.end(),
                                          [](uint64_t b) { return b > 0; })},
          {"index_max_bytes_per_writer", largest_share},
          {"restore_boxes_per_rank", most.size()},
          {"restore_index_bytes_per_rank", read},
          {"restore_metadata_bytes_per_rank", text.size() + read},
          {"restore_marker_parse_cpu_seconds", marker_parse},
          {"restore_parse_cpu_seconds_per_rank", parse_cpu},
          {"restore_parse_seconds_per_rank", parse_wall}};
}

// RootPlan `reps` times: the figures of the one with the least CPU time (this
// machine is shared; the least disturbed run is the closest to the work), and
// every run's CPU and wall time.
json RootPlanReps(const Gathered& g, uint64_t rp_min_bytes, uint64_t chunk_bytes, int reps,
                  io::Marker* plan_out) {
  json best, cpu = json::array(), wall = json::array();
  for (int i = 0; i < std::max(1, reps); ++i) {
    json p = RootPlan(g, rp_min_bytes, chunk_bytes, i == 0 ? plan_out : nullptr);
    cpu.push_back(p["root_cpu_seconds"]);
    wall.push_back(p["root_seconds"]);
    if (best.is_null() || p["root_cpu_seconds"] < best["root_cpu_seconds"]) best = std::move(p);
  }
  best["samples_cpu_seconds"] = cpu;
  best["samples_seconds"] = wall;
  return best;
}

// The round without deduplication: every description gathered and decoded.
json FullPlan(Encoder& encoder, int ranks) {
  std::vector<std::string> all;
  double ignored = 0;
  for (int r = 0; r < ranks; ++r) all.push_back(encoder.Encode(r, &ignored));
  PeakMeter meter;
  meter.Mark();
  const double cpu0 = ThreadCpuSeconds();
  auto t0 = Clock::now();
  std::vector<RankDescription> decoded;
  for (const std::string& e : all) decoded.push_back(internal::DecodeDescription(e).value());
  const double decode_s = Since(t0);
  Result<io::Marker> plan = internal::BuildPlan(decoded, 0);
  if (!plan.ok()) throw std::runtime_error(plan.status().ToString());
  std::string text = io::MarkerToJson(*plan, io::MarkerText::kPlan);
  return {{"decode_seconds", decode_s},
          {"root_seconds", Since(t0)},
          {"root_cpu_seconds", ThreadCpuSeconds() - cpu0},
          {"root_peak_bytes", meter.Peak()},
          {"plan_json_bytes", text.size()},
          {"plan_json_xxh3", XXH3_64bits(text.data(), text.size())}};
}

json Run(const Flags& f) {
  Model m = FindModel(f.model);
  if (f.tp > 0) m.tp = f.tp;
  if (f.pp > 0) m.pp = f.pp;
  if (f.ranks % (m.tp * m.pp) != 0) {
    throw std::invalid_argument(
        fmt::format("{} ranks are not a multiple of TP x PP = {}", f.ranks, m.tp * m.pp));
  }
  const std::vector<Tensor> tensors = BuildTensors(m, f.arrays);
  json out = {{"model", m.name},      {"ranks", f.ranks}, {"arrays", tensors.size()},
              {"tp", m.tp},           {"pp", m.pp},       {"dp", f.ranks / (m.tp * m.pp)},
              {"load", LoadAverage()}};
  Encoder encoder(tensors, m, f.every_rank);
  Gathered g = SimulateRanks(encoder, f.ranks);
  out["encode_seconds_per_rank"] = g.encode_seconds;
  int64_t root_received = 0;
  std::vector<int64_t> sent_sizes;
  for (const std::string& s : g.sent) sent_sizes.push_back(static_cast<int64_t>(s.size()));
  for (const std::string& d : g.digests) root_received += static_cast<int64_t>(d.size());
  out["gather_without_dedup"] = GatherShape(g.sizes);
  out["gather_dedup"] = GatherShape(sent_sizes);
  out["gather_dedup"]["digest_bytes"] = root_received;
  io::Marker plan;
  out["chunk_bytes"] = f.chunk_bytes;
  out["plan"] = RootPlanReps(g, 0, f.chunk_bytes, f.reps, &plan);
  out["hdf5_metadata_ops"] = MetadataOps(plan);
  out["total_bytes"] = plan.total_bytes;
  out["commit"] = Commit(plan, tensors, m, f.index_dir);
  plan = {};
  if (f.rp_min_bytes > 0) {
    out["plan_replica_parallel"] = RootPlanReps(g, f.rp_min_bytes, f.chunk_bytes, f.reps, nullptr);
    out["plan_replica_parallel"]["rp_min_bytes"] = f.rp_min_bytes;
  }
  if (f.full) {
    if (out["gather_without_dedup"]["bytes"].get<int64_t>() <= f.full_max_bytes) {
      out["plan_without_dedup"] = FullPlan(encoder, f.ranks);
      out["plan_without_dedup"]["same_plan"] =
          out["plan_without_dedup"]["plan_json_xxh3"] == out["plan"]["plan_json_xxh3"];
    } else {
      out["plan_without_dedup"] = {{"skipped", "gathered bytes above --full-max-bytes"}};
    }
  }
  return out;
}

// One line per figure, for a reader; the JSON has them all.
void PrintPlan(const char* what, const json& p) {
  std::printf(
      "  %s: %d layouts; rank 0 %.3f s (cpu %.3f; group %.3f, plan %.3f), peak %.1f MB;"
      " plan JSON %.2f MB, parse per rank %.3f s\n"
      "    %d boxes, %d writers, max/mean %.3f (of writers %.3f)\n",
      what, p["layouts"].get<int>(), p["root_seconds"].get<double>(),
      p["root_cpu_seconds"].get<double>(), p["group_seconds"].get<double>(),
      p["plan_seconds"].get<double>(), p["root_peak_bytes"].get<double>() / 1e6,
      p["plan_json_bytes"].get<double>() / 1e6, p["parse_seconds_per_rank"].get<double>(),
      p["balance"]["boxes"].get<int>(), p["balance"]["writers"].get<int>(),
      p["balance"]["max_over_mean"].get<double>(),
      p["balance"]["max_over_mean_of_writers"].get<double>());
}

void Print(const json& o) {
  std::printf(
      "%s: %d ranks (TP %d x PP %d x DP %d), %d arrays, %.1f GB of array data\n"
      "  per rank: encode + digest %.4f s\n"
      "  gathered without dedup: %.1f MB in %d round(s), int counts fit: %s\n"
      "  gathered with dedup: %.2f MB of descriptions + %.2f MB of digests\n",
      o["model"].get<std::string>().c_str(), o["ranks"].get<int>(), o["tp"].get<int>(),
      o["pp"].get<int>(), o["dp"].get<int>(), o["arrays"].get<int>(),
      o["total_bytes"].get<double>() / 1e9, o["encode_seconds_per_rank"].get<double>(),
      o["gather_without_dedup"]["bytes"].get<double>() / 1e6,
      o["gather_without_dedup"]["rounds"].get<int>(),
      o["gather_without_dedup"]["int_counts_fit"].get<bool>() ? "yes" : "NO",
      o["gather_dedup"]["bytes"].get<double>() / 1e6,
      o["gather_dedup"]["digest_bytes"].get<double>() / 1e6);
  PrintPlan("plan", o["plan"]);
  if (o.contains("plan_replica_parallel")) {
    const std::string what = fmt::format("replica-parallel (>= {} B)",
                                         o["plan_replica_parallel"]["rp_min_bytes"].get<int64_t>());
    PrintPlan(what.c_str(), o["plan_replica_parallel"]);
  }
  const json& c2 = o["commit"]["format2"];
  const json& c3 = o["commit"]["format3"];
  std::printf(
      "  commit, format 2: rank 0 gathers %.2f MB, %.3f s cpu, writes a %.2f MB marker;"
      " restore metadata per rank %.2f MB, parsed in %.3f s cpu\n"
      "  commit, format 3: rank 0 gathers %.2f MB, %.3f s cpu, writes a %.2f MB marker;"
      " index %.2f MB by %d writers (at most %.2f MB each)\n"
      "    restore metadata per rank %.2f MB (%.2f MB of index, %d boxes), parsed in %.3f s cpu"
      " (marker %.3f s)\n",
      c2["reports_bytes"].get<double>() / 1e6, c2["root_commit_cpu_seconds"].get<double>(),
      c2["marker_json_bytes"].get<double>() / 1e6,
      c2["restore_metadata_bytes_per_rank"].get<double>() / 1e6,
      c2["restore_parse_cpu_seconds_per_rank"].get<double>(),
      c3["reports_bytes"].get<double>() / 1e6, c3["root_commit_cpu_seconds"].get<double>(),
      c3["marker_json_bytes"].get<double>() / 1e6, c3["index_bytes"].get<double>() / 1e6,
      c3["index_writers"].get<int>(), c3["index_max_bytes_per_writer"].get<double>() / 1e6,
      c3["restore_metadata_bytes_per_rank"].get<double>() / 1e6,
      c3["restore_index_bytes_per_rank"].get<double>() / 1e6,
      c3["restore_boxes_per_rank"].get<int>(),
      c3["restore_parse_cpu_seconds_per_rank"].get<double>(),
      c3["restore_marker_parse_cpu_seconds"].get<double>());
  const json& sf = o["commit"]["subfiles_per_node"];
  std::printf(
      "  subfiles, one per node of 8 ranks (%d): index %.2f MB; restore metadata per rank %.2f MB,"
      " parsed in %.3f s cpu; it opens %d subfiles\n"
      "    rank 0 makes data.h5: %d virtual datasets, %d mappings, %.3f s (%.3f s cpu), %.2f MB;"
      " busiest group lays out %d datasets in %.3f s\n",
      sf["files"].get<int>(), sf["index_bytes"].get<double>() / 1e6,
      sf["restore_metadata_bytes_per_rank"].get<double>() / 1e6,
      sf["restore_parse_cpu_seconds_per_rank"].get<double>(),
      sf["restore_files_per_rank"].get<int>(), sf["layout"]["root_virtual_datasets"].get<int>(),
      sf["layout"]["root_mappings"].get<int>(), sf["layout"]["root_seconds"].get<double>(),
      sf["layout"]["root_cpu_seconds"].get<double>(),
      sf["layout"]["data_h5_bytes"].get<double>() / 1e6,
      sf["layout"]["group_datasets_max"].get<int>(), sf["layout"]["group_seconds"].get<double>());
  std::printf("  HDF5 metadata ops: save %d, restore %d; collective writes per save %d\n",
              o["hdf5_metadata_ops"]["save"].get<int>(),
              o["hdf5_metadata_ops"]["restore"].get<int>(),
              o["hdf5_metadata_ops"]["collective_writes_per_save"].get<int>());
  if (o.contains("plan_without_dedup")) {
    std::printf("  without dedup: %s\n", o["plan_without_dedup"].dump().c_str());
  }
}

}  // namespace
}  // namespace mhckpt::bench

int main(int argc, char** argv) {
  return mhckpt::GuardedMain("mhckpt-plan-sim", [&] {
    mhckpt::bench::Flags f;
    CLI::App app{"The plan round of a save at N simulated ranks (docs/SCALE.md)"};
    app.add_option("--model", f.model, "70b, 400b or tiny")
        ->check(CLI::IsMember({"70b", "400b", "tiny"}));
    app.add_option("--ranks", f.ranks, "Simulated ranks (a multiple of TP x PP)");
    app.add_option("--arrays", f.arrays, "Arrays (layers added or removed; 0: the model's own)");
    app.add_option("--tp", f.tp, "Tensor-parallel ranks (0: the model's default)");
    app.add_option("--pp", f.pp, "Pipeline stages (0: the model's default)");
    app.add_option("--rp-min-bytes", f.rp_min_bytes,
                   "Options::replica_parallel_min_bytes of the second plan");
    app.add_option("--chunk-bytes", f.chunk_bytes,
                   "Options::checksum_chunk_bytes (the commit marker's chunk checksums)")
        ->check(CLI::PositiveNumber);
    app.add_option("--reps", f.reps, "Plans per figure (the least CPU time is reported)");
    app.add_flag("--full", f.full, "Also plan without deduplication (every description decoded)");
    app.add_flag("--encode-every-rank", f.every_rank,
                 "Build and encode every rank's description (else once per TP x PP position)");
    app.add_option("--full-max-bytes", f.full_max_bytes, "Skip --full above these gathered bytes");
    app.add_option("--json", f.json_path, "Write the figures here");
    app.add_option("--index-dir", f.index_dir,
                   "Where the format-3 index is written, read in part and removed");
    CLI11_PARSE(app, argc, argv);
    nlohmann::json out = mhckpt::bench::Run(f);
    mhckpt::bench::Print(out);
    if (!f.json_path.empty()) std::ofstream(f.json_path) << out.dump(2) << "\n";
    // Exit status for ctest: the gather's int counts fit, and the plan without
    // deduplication (when made) is the deduplicated plan byte for byte.
    const bool fits = out["gather_without_dedup"]["int_counts_fit"].get<bool>();
    const bool same =
        !out.contains("plan_without_dedup") || out["plan_without_dedup"].value("same_plan", true);
    if (!fits || !same)
      std::fprintf(stderr, "mhckpt-plan-sim: FAILED (fits %d, same plan %d)\n", fits, same);
    return fits && same ? 0 : 1;
  });
}
