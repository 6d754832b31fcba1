// Verify of one committed step, run by every rank on its I/O thread:
//
//   1. Rank 0 reads the commit marker and broadcasts it; every rank parses
//      the same bytes (coordinator/committed_step.h). A marker that does not
//      parse, or names another step, ends the verify here. Rank 0 checks that
//      the boxes of every array tile it exactly once (CheckTiling, the
//      plan's own check). In a version-3 step rank 0 reads the whole index
//      and checks each record, its size and its checksum in the marker; the
//      others read (step 3) the records of the boxes dealt to them. A rank
//      whose records cannot be read reports it and checks no box against
//      them.
//   2. All ranks open the step through the storage engine, and agree on it:
//      a rank that cannot open it must not leave the others alone in the
//      collective opens that follow. Then every array, collectively; the
//      engine checks its dtype, shape and (version 2) that its dataset lies
//      at the offset the marker records. Where every array has one, the
//      bytes are read by offset (pread, io/pread_reader.h), else through
//      HDF5.
//   3. The boxes of the arrays that opened are dealt to the ranks by bytes
//      (largest first, each to the least loaded rank). Each rank reads its
//      boxes in slabs of whole rows of at most kSlabBytes, so a huge box
//      never becomes a huge allocation — boxes of one slab together, up to
//      kSlabBytes per batch, so that small arrays are read in few requests —
//      and checks each box's checksum
//      against the marker — and, from version 2 on, each chunk's (slabs
//      hold whole chunks), so a marker whose chunk checksums disagree with
//      the file fails here and not at a later restore. A problem is noted
//      and the walk goes on.
//   4. Close. Rank 0 gathers every rank's problems and bytes read, and
//      broadcasts the report, so that every rank returns the same Status:
//      DataLoss naming the first problem and counting the others, or OK.
//   5. Agree on what went wrong on a rank other than the step itself: an
//      exception of VerifyOptions::progress or of this code is Internal
//      naming the rank, on every rank (it outranks the report's DataLoss).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/committed_step.h"
#include "coordinator/manager_impl.h"
#include "coordinator/plan.h"
#include "io/layout.h"
#include "io/step_index.h"

namespace mhckpt::internal {
namespace {

constexpr uint64_t kSlabBytes = uint64_t{64} << 20;

// Scratch memory that starts on a page, so that the reads into it can go
// straight from the disk (VerifyOptions::direct_reads); never touched here
// before a read lands in it.
class PageBuffer {
 public:
  explicit PageBuffer(uint64_t bytes) {
    constexpr size_t kPage = 4096;
    const size_t size =
        (static_cast<size_t>(std::max<uint64_t>(bytes, 1)) + kPage - 1) / kPage * kPage;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(kPage, size)));
    if (!data_) throw std::bad_alloc();
  }
  std::byte* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
};

// One stored box to read and check, cut into slabs of whole rows
// (dimension 0) so that no single read is larger than kSlabBytes.
struct BoxRead {
  size_t array = 0;
  size_t box = 0;
  std::vector<Box> slabs;  // in row order: their bytes, concatenated, are the box's
  uint64_t bytes = 0;
  uint64_t largest_slab = 0;
};

// Every box of the arrays that opened (`handles[i]` set), cut into slabs.
std::vector<BoxRead> PlanReads(const io::Marker& m,
                               const std::vector<std::optional<size_t>>& handles) {
  std::vector<BoxRead> reads;
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (!handles[i]) continue;
    const io::MarkerArray& a = m.arrays[i];
    const uint64_t elem = DTypeSize(a.dtype);
    for (size_t b = 0; b < a.boxes.size(); ++b) {
      const Box& box = a.boxes[b].box;
      const int64_t volume = Volume(box.count).value_or(0);
      BoxRead read{i, b, {}, static_cast<uint64_t>(volume) * elem, 0};
      if (volume == 0) {
        // Nothing to read; the checksum is still that of zero bytes.
      } else if (box.count.empty()) {  // a 0-d array
        read.slabs.push_back(box);
      } else {
        const uint64_t row_bytes = static_cast<uint64_t>(volume / box.count[0]) * elem;
        int64_t rows_per_slab = std::max<int64_t>(1, static_cast<int64_t>(kSlabBytes / row_bytes));
        const int64_t chunk_rows = a.boxes[b].chunk_rows;
        if (chunk_rows > 0)
          rows_per_slab = std::max(chunk_rows, rows_per_slab / chunk_rows * chunk_rows);
        for (int64_t r = 0; r < box.count[0]; r += rows_per_slab) {
          Box slab = box;
          slab.start[0] = box.start[0] + r;
          slab.count[0] = std::min(rows_per_slab, box.count[0] - r);
          read.slabs.push_back(slab);
        }
      }
      for (const Box& slab : read.slabs) {
        read.largest_slab =
            std::max(read.largest_slab, static_cast<uint64_t>(*Volume(slab.count)) * elem);
      }
      reads.push_back(std::move(read));
    }
  }
  return reads;
}

// The rank that reads each box: largest boxes first, each to the least
// loaded rank so far (by bytes). Deterministic: every rank computes the same.
std::vector<int> DealReads(const std::vector<BoxRead>& reads, int ranks) {
  std::vector<size_t> order(reads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return reads[x].bytes > reads[y].bytes; });
  std::vector<uint64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(reads.size(), 0);
  for (size_t i : order) {
    auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += reads[i].bytes;
    owner[i] = static_cast<int>(r);
  }
  return owner;
}

// What one rank found, and what the report says once gathered.
struct Findings {
  uint64_t bytes = 0;  // read back
  std::vector<std::string> problems;
};

std::string EncodeFindings(const Findings& f) {
  std::vector<uint8_t> cbor = nlohmann::json::to_cbor(nlohmann::json::array({f.bytes, f.problems}));
  return {cbor.begin(), cbor.end()};
}

Findings DecodeFindings(const std::string& bytes) {
  try {
    nlohmann::json j = nlohmann::json::from_cbor(bytes);
    return {j.at(0).get<uint64_t>(), j.at(1).get<std::vector<std::string>>()};
  } catch (const nlohmann::json::exception& e) {
    return {0, {fmt::format("cannot decode a rank's findings: {}", e.what())}};
  }
}

// The verify of one step on one rank: the steps of the protocol above.
class StepVerifier {
 public:
  StepVerifier(const Comm& comm, io::Engine& engine, io::RootStore& store, int64_t step,
               const VerifyOptions& options)
      : comm_(comm), engine_(engine), store_(store), step_(step), options_(options) {}

  Status Run(VerifyReport* report) {
    Result<io::Marker> m = ReadMarker();
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kDataLoss) report->problems = {m.status().message()};
      return m.status();
    }
    // Format 3: rank 0 reads the whole index, checks every record, its size
    // and its checksum; the other ranks read the records of the boxes they
    // check (ReadShare).
    if (m->format_version >= 3 && comm_.rank() == 0) {
      Status index = io::LoadIndex(IndexPath(), &*m);
      index_ok_ = index.ok();
      if (!index.ok()) Problem(index.message());
    }
    report->arrays = m->arrays.size();
    for (const io::MarkerArray& a : m->arrays) report->boxes += a.boxes.size();
    if (comm_.rank() == 0) Local("tiling check", [&] { CheckTilings(*m); });
    // Read by offset where the marker places every array; the engine still
    // checks each array's dataset (dtype, shape, offset): verify answers for
    // the file as HDF5 tools see it, too.
    io::ReadOptions how;
    how.by_offset =
        m->files > 0 || std::all_of(m->arrays.begin(), m->arrays.end(),
                                    [](const io::MarkerArray& a) { return ReadableByOffset(a); });
    how.files = m->files;
    how.check_metadata = true;
    how.direct = options_.direct_reads;
    Result<std::unique_ptr<io::StepReader>> reader = engine_.Open(store_.root(), step_, comm_, how);
    Status opened = AgreeAll(reader.status(), comm_);
    if (!opened.ok()) {
      Note(fmt::format("data file: {}", opened.ToString()));
    } else {
      std::vector<std::optional<size_t>> handles = OpenArrays(*m, **reader);
      Local("read", [&] { ReadShare(*m, **reader, handles); });
      Status closed = (*reader)->Close();
      if (!closed.ok()) Problem(fmt::format("close: {}", closed.ToString()));
    }
    Status found = Gather(report);
    // 5. Why an agreement: only the rank that caught an exception knows of it.
    Status failed = AgreeAll(failure_, comm_);
    return failed.ok() ? found : failed;
  }

 private:
  // 1. The marker, the same on every rank.
  Result<io::Marker> ReadMarker() {
    Result<io::Marker> m = ReadMarkerEverywhere(comm_, store_, step_);
    if (!m.ok() && m.status().code() == StatusCode::kDataLoss) {
      return DataLoss(fmt::format("step {}: {}", step_, m.status().message()));
    }
    return m;
  }

  // 1, on rank 0: the boxes of every array tile it.
  void CheckTilings(const io::Marker& m) {
    for (const io::MarkerArray& a : m.arrays) {
      std::vector<RankedBox> boxes;
      for (const io::MarkerBox& b : a.boxes) boxes.push_back({&b.box, b.writer});
      if (Status s = CheckTiling(a.name, a.shape, std::move(boxes)); !s.ok()) Note(s.message());
    }
  }

  // 2. Every array, collectively; the same outcome on every rank.
  std::vector<std::optional<size_t>> OpenArrays(const io::Marker& m, io::StepReader& reader) {
    std::vector<std::optional<size_t>> handles(m.arrays.size());
    std::vector<int> failed(m.arrays.size(), 0);
    for (size_t i = 0; i < m.arrays.size(); ++i) {
      Result<size_t> h = reader.OpenArray(StoredSpec(m.arrays[i]));
      if (h.ok()) {
        handles[i] = *h;
      } else {
        failed[i] = 1;
        Note(h.status().message());
      }
    }
    // The opens are collective, so their outcome is the same everywhere; the
    // maximum over ranks makes sure of it before the reads are dealt.
    comm_.AllreduceMax(&failed);
    for (size_t i = 0; i < handles.size(); ++i) {
      if (failed[i]) handles[i].reset();
    }
    return handles;
  }

  // 3. This rank's share of the boxes. Boxes of one slab are read together
  // in batches of up to kSlabBytes (sorted and joined by a reader by
  // offset); larger ones slab by slab.
  void ReadShare(io::Marker& m, io::StepReader& reader,
                 const std::vector<std::optional<size_t>>& handles) {
    const std::vector<BoxRead> reads = PlanReads(m, handles);
    const std::vector<int> owner = DealReads(reads, comm_.size());
    if (m.format_version >= 3 && comm_.rank() != 0) LoadMyRecords(m, reads, owner);
    uint64_t largest = 0, small = 0;
    for (size_t i = 0; i < reads.size(); ++i) {
      if (owner[i] != comm_.rank()) continue;
      share_ += reads[i].bytes;
      largest = std::max(largest, reads[i].largest_slab);
      if (reads[i].slabs.size() == 1) small += reads[i].bytes;
    }
    Progress(0);
    PageBuffer buffer(std::max(largest, std::min(small, kSlabBytes)));
    std::vector<const BoxRead*> batch;
    uint64_t batched = 0;
    for (size_t i = 0; i < reads.size(); ++i) {
      if (owner[i] != comm_.rank()) continue;
      const BoxRead& r = reads[i];
      if (r.slabs.size() != 1) {
        ReadBox(m, r, reader, *handles[r.array], buffer);
        continue;
      }
      if (batched + r.bytes > kSlabBytes) {
        ReadTogether(m, batch, reader, handles, buffer);
        batched = 0;
      }
      batch.push_back(&r);
      batched += r.bytes;
    }
    ReadTogether(m, batch, reader, handles, buffer);
  }

  // 3, format 3, a rank other than 0: the index records of the boxes dealt
  // to it. A bad one is this rank's problem; its boxes are then unchecked.
  void LoadMyRecords(io::Marker& m, const std::vector<BoxRead>& reads,
                     const std::vector<int>& owner) {
    std::vector<io::BoxRef> mine;
    for (size_t i = 0; i < reads.size(); ++i) {
      if (owner[i] == comm_.rank()) {
        mine.emplace_back(static_cast<uint32_t>(reads[i].array),
                          static_cast<uint32_t>(reads[i].box));
      }
    }
    Result<io::IndexLayout> layout = io::IndexLayout::Of(m, IndexPath());
    Status loaded =
        layout.ok() ? io::LoadIndexRecords(IndexPath(), *layout, mine, &m) : layout.status();
    index_ok_ = loaded.ok();
    if (!loaded.ok()) Problem(fmt::format("rank {}: {}", comm_.rank(), loaded.message()));
  }

  [[nodiscard]] std::string IndexPath() const { return io::IndexPath(store_.root(), step_); }

  // 3, boxes of one slab each, read together into `buffer`; if the batch
  // fails, box by box, so that each problem names its box.
  void ReadTogether(const io::Marker& m, std::vector<const BoxRead*>& batch, io::StepReader& reader,
                    const std::vector<std::optional<size_t>>& handles, const PageBuffer& buffer) {
    std::vector<io::ReadRequest> requests;
    uint64_t at = 0;
    bool placed = true;
    for (const BoxRead* r : batch) {
      std::optional<io::ReadRequest> q =
          Request(m, *r, r->slabs[0], reader, *handles[r->array], buffer.data() + at);
      placed = placed && q.has_value();
      if (q) requests.push_back(std::move(*q));
      at += r->bytes;
    }
    if (!placed || !reader.ReadMany(requests).ok()) {
      for (const BoxRead* r : batch) ReadBox(m, *r, reader, *handles[r->array], buffer);
    } else {
      for (size_t i = 0; i < batch.size(); ++i) {
        done_ += batch[i]->bytes;
        Progress(done_);
        CheckBox(m, *batch[i], static_cast<const std::byte*>(requests[i].data));
      }
    }
    batch.clear();
  }

  // 3, one box of one slab, read into `data`: its checksums.
  void CheckBox(const io::Marker& m, const BoxRead& read, const std::byte* data) {
    const io::MarkerArray& a = m.arrays[read.array];
    const io::MarkerBox& box = a.boxes[read.box];
    const auto bytes = static_cast<size_t>(read.bytes);
    if (!index_ok_) return;
    if (!box.chunks.empty() && !Noted(CheckChunks(a, box, read.slabs[0], data))) return;
    if (!Noted(CheckChecksum(a, box, Checksum(data, bytes)))) return;
    mine_.bytes += read.bytes;
  }

  // 3, the read of `slab` of a box into `data`: of the array (`handle`), or
  // with subfiles of the box's own dataset in its subfile (its place from
  // the index). nullopt, noted, if the box cannot be opened there.
  std::optional<io::ReadRequest> Request(const io::Marker& m, const BoxRead& read, const Box& slab,
                                         io::StepReader& reader, size_t handle, void* data) {
    if (m.files == 0) return io::ReadRequest{handle, slab, data, nullptr};
    const io::MarkerArray& a = m.arrays[read.array];
    const io::MarkerBox& box = a.boxes[read.box];
    if (!index_ok_) return std::nullopt;  // no place known: noted with the index
    auto [it, fresh] = box_handles_.try_emplace({read.array, read.box}, 0);
    if (fresh) {
      Result<size_t> h =
          reader.OpenBox({a.name, a.dtype, box.box.count, box.file_offset, -1, {}}, box.file);
      if (!h.ok()) {
        box_handles_.erase(it);
        Problem(fmt::format("array '{}' box {} (written by rank {}): {}", a.name,
                            BoxToString(box.box), box.writer, h.status().message()));
        return std::nullopt;
      }
      it->second = *h;
    }
    Box local = slab;
    for (size_t d = 0; d < local.start.size(); ++d) local.start[d] -= box.box.start[d];
    return io::ReadRequest{it->second, std::move(local), data, nullptr};
  }

  // 3, one box: slab by slab, then its checksum.
  void ReadBox(const io::Marker& m, const BoxRead& read, io::StepReader& reader, size_t handle,
               const PageBuffer& buffer) {
    const io::MarkerArray& a = m.arrays[read.array];
    const io::MarkerBox& box = a.boxes[read.box];
    if (!index_ok_) return;
    ChecksumStream checksum;
    for (const Box& slab : read.slabs) {
      const uint64_t bytes = static_cast<uint64_t>(*Volume(slab.count)) * DTypeSize(a.dtype);
      std::optional<io::ReadRequest> q = Request(m, read, slab, reader, handle, buffer.data());
      if (!q) return;  // noted
      Status s = reader.Read(q->array, q->box, q->data);
      done_ += bytes;
      Progress(done_);
      if (!s.ok()) {
        Problem(fmt::format("array '{}' box {}: slab {} unreadable on rank {}: {}", a.name,
                            BoxToString(box.box), BoxToString(slab), comm_.rank(), s.ToString()));
        return;
      }
      checksum.Update(buffer.data(), static_cast<size_t>(bytes));
      if (!box.chunks.empty() && !Noted(CheckChunks(a, box, slab, buffer.data()))) return;
    }
    if (!Noted(CheckChecksum(a, box, checksum.Digest()))) return;
    mine_.bytes += read.bytes;
  }

  // 4. Every rank's findings to rank 0, and the report back to every rank.
  Status Gather(VerifyReport* report) {
    std::vector<std::string> all = comm_.GatherBytes(EncodeFindings(mine_), 0);
    std::string merged;
    if (comm_.rank() == 0) {
      Findings f;
      for (const std::string& bytes : all) {
        Findings r = DecodeFindings(bytes);
        f.bytes += r.bytes;
        f.problems.insert(f.problems.end(), r.problems.begin(), r.problems.end());
      }
      merged = EncodeFindings(f);
    }
    comm_.BroadcastBytes(&merged, 0);
    Findings f = DecodeFindings(merged);
    report->bytes_checked = f.bytes;
    report->problems = std::move(f.problems);
    if (report->problems.empty()) return OkStatus();
    const size_t more = report->problems.size() - 1;
    return DataLoss(more == 0 ? report->problems[0]
                              : fmt::format("{} (and {} more problem{})", report->problems[0], more,
                                            more == 1 ? "" : "s"));
  }

  // Runs a rank-local part of the protocol; an exception is kept as this
  // rank's failure (step 5) and the protocol goes on to its collectives.
  template <typename F>
  void Local(const char* what, F&& f) {
    Status s = Guarded(fmt::format("rank {}: verify of step {}: {}", comm_.rank(), step_, what),
                       std::forward<F>(f));
    if (failure_.ok()) failure_ = s;
  }

  // VerifyOptions::progress, if any, until it throws once.
  void Progress(uint64_t done) {
    if (!options_.progress || progress_failed_) return;
    Status s = Guarded(fmt::format("rank {}: VerifyOptions::progress", comm_.rank()),
                       [&] { options_.progress(done, share_); });
    if (!s.ok()) {
      progress_failed_ = true;
      if (failure_.ok()) failure_ = s;
    }
  }

  // A problem this rank found, named with the step.
  void Problem(const std::string& what) {
    mine_.problems.push_back(fmt::format("step {}: {}", step_, what));
  }
  // 3: a failed check of this rank's as a problem. False if it failed.
  bool Noted(const Status& check) {
    if (!check.ok()) Problem(check.message());
    return check.ok();
  }
  // A problem every rank found alike: rank 0 notes it.
  void Note(const std::string& what) {
    if (comm_.rank() == 0) Problem(what);
  }

  const Comm& comm_;
  io::Engine& engine_;
  io::RootStore& store_;
  const int64_t step_;
  const VerifyOptions& options_;
  Findings mine_;
  uint64_t share_ = 0;    // bytes of the boxes dealt to this rank
  uint64_t done_ = 0;     // of them, read so far
  Status failure_;        // an exception on this rank (step 5)
  bool index_ok_ = true;  // format 3: the index was read and checked
  std::map<std::pair<size_t, size_t>, size_t> box_handles_;  // subfiles: (array, box) opened
  bool progress_failed_ = false;
};

}  // namespace

Status ManagerImpl::RunVerify(int64_t step, const VerifyOptions& options, VerifyReport* report) {
  *report = VerifyReport();
  return StepVerifier(comm_, *engine_, *store_, step, options).Run(report);
}

}  // namespace mhckpt::internal
