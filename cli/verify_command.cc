// Verify, as run by every rank:
//
//   1. Rank 0 lists the root and picks the steps (and reports invalid
//      markers); the list is broadcast.
//   2. Per step, rank 0 reads the marker; every rank parses the same bytes.
//      Rank 0 checks that the boxes tile each array.
//   3. All ranks open the data file and every dataset collectively (HDF5
//      metadata is collective), which checks existence, type and shape.
//   4. The boxes are dealt to the ranks by bytes (largest first, to the least
//      loaded); each rank reads its boxes with independent transfers, in
//      slabs of at most chunk_bytes, and checks each box's XXH3 checksum
//      against the marker.
//   5. Close; the problems of every rank are gathered at rank 0, which
//      prints them; the outcome is broadcast, so every rank exits alike.
#include "cli/verify_command.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "base/checksum.h"
#include "cli/mpi_util.h"
#include "cli/progress.h"
#include "cli/text_format.h"
#include "io/catalog.h"
#include "io/h5_file.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/posix_file.h"

namespace mhckpt::cli {
namespace {

// One marker box to read and checksum, cut into slabs of whole rows
// (dimension 0) so that no single read is larger than the chunk size.
struct BoxRead {
  size_t array = 0;
  size_t box = 0;
  std::vector<Box> slabs;  // in row order: their bytes, concatenated, are the box's
  uint64_t bytes = 0;
  uint64_t largest_slab = 0;
};

struct StepReport {
  size_t arrays = 0, boxes = 0;
  uint64_t bytes_read = 0;  // over all ranks
  std::vector<std::string> problems;
};

// Why the boxes of `a` do not cover every element exactly once, or "".
std::string CheckTiling(const io::MarkerArray& a) {
  const int64_t volume = Volume(a.shape).value_or(0);
  int64_t covered = 0;
  for (size_t i = 0; i < a.boxes.size(); ++i) {
    covered += Volume(a.boxes[i].box.count).value_or(0);
    for (size_t j = 0; j < i; ++j) {
      if (BoxesIntersect(a.boxes[i].box, a.boxes[j].box)) {
        return fmt::format("boxes {} and {} overlap", BoxToString(a.boxes[j].box),
                           BoxToString(a.boxes[i].box));
      }
    }
  }
  if (covered != volume) {
    return fmt::format("boxes cover {} of its {} elements", covered, volume);
  }
  return "";
}

// Every box of the arrays that opened, cut into slabs of at most
// `chunk_bytes` (at least one row each).
std::vector<BoxRead> PlanReads(const io::Marker& m, const std::vector<bool>& opened,
                               uint64_t chunk_bytes) {
  std::vector<BoxRead> reads;
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (!opened[i]) continue;
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
        const int64_t rows_per_slab =
            std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / row_bytes));
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

// The rank that reads each box: largest boxes first, each to the least loaded
// rank so far (by bytes). Deterministic, so every rank computes the same.
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

// Reads one box slab by slab and checks its checksum; "" or the problem.
std::string ReadBox(const io::Marker& m, const BoxRead& read, io::Dataset& dataset,
                    std::vector<std::byte>& buffer, int rank, Progress& progress) {
  const io::MarkerArray& a = m.arrays[read.array];
  const io::MarkerBox& box = a.boxes[read.box];
  auto where = [&] {
    return fmt::format("step {}: array '{}' box {} (written by rank {})", m.step, a.name,
                       BoxToString(box.box), box.writer);
  };
  ChecksumStream checksum;
  for (const Box& slab : read.slabs) {
    const uint64_t bytes = static_cast<uint64_t>(*Volume(slab.count)) * DTypeSize(a.dtype);
    Status s = dataset.Read(slab, buffer.data());
    progress.Advance(bytes);
    if (!s.ok()) {
      return fmt::format("{}: slab {} unreadable on rank {}: {}", where(), BoxToString(slab), rank,
                         s.ToString());
    }
    checksum.Update(buffer.data(), static_cast<size_t>(bytes));
  }
  if (checksum.Digest() != box.checksum) {
    return fmt::format("{}: checksum mismatch: the marker has {}, the data reads as {}", where(),
                       ChecksumToString(box.checksum), ChecksumToString(checksum.Digest()));
  }
  return "";
}

// Collective: steps 2 to 5 of the top comment for one step.
StepReport VerifyStep(const std::string& root, int64_t step, uint64_t chunk_bytes, MPI_Comm comm,
                      Progress& progress) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  StepReport report;
  auto problem = [&](const std::string& what) {
    report.problems.push_back(fmt::format("step {}: {}", step, what));
  };

  // 2. The marker.
  std::string text;
  Status read;
  if (rank == 0) {
    Result<std::string> r = io::ReadSmallFile(io::MarkerPath(root, step), io::kMaxMarkerBytes);
    read = r.status();
    if (r.ok()) text = std::move(r).value();
  }
  read = BroadcastStatus(read, 0, comm);
  if (!read.ok()) {
    if (rank == 0) {
      problem(read.code() == StatusCode::kNotFound ? "not committed (no commit marker)"
                                                   : read.ToString());
    }
    return report;
  }
  BroadcastString(&text, 0, comm);
  Result<io::Marker> parsed = io::ParseMarker(text, io::MarkerPath(root, step));
  if (!parsed.ok() || parsed->step != step) {
    if (rank == 0) {
      problem(parsed.ok() ? fmt::format("commit marker says step {}", parsed->step)
                          : parsed.status().ToString());
    }
    return report;
  }
  const io::Marker& m = *parsed;
  report.arrays = m.arrays.size();
  for (const io::MarkerArray& a : m.arrays) {
    report.boxes += a.boxes.size();
    if (std::string why = CheckTiling(a); !why.empty() && rank == 0) {
      problem(fmt::format("array '{}' {}: {}", a.name, ShapeToString(a.shape), why));
    }
  }

  // 3. Open the file and every dataset.
  Result<io::H5File> file =
      io::H5File::OpenReadOnly(io::DataPath(root, step), comm, io::Transfer::kIndependent);
  // Why agree: a rank that could not open the file must not leave the others
  // alone in the collective dataset opens below.
  int file_ok = file.ok() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&file_ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) {
    if (rank == 0) {
      problem(fmt::format("data file: {}", file.ok() ? "cannot be opened on another rank"
                                                     : file.status().ToString()));
    }
    return report;
  }
  std::vector<io::Dataset> datasets(m.arrays.size());
  std::vector<bool> opened(m.arrays.size(), false);
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    const io::MarkerArray& a = m.arrays[i];
    Result<io::Dataset> ds = file->OpenDataset(a.name, a.dtype, a.shape);
    if (ds.ok()) {
      datasets[i] = std::move(ds).value();
      opened[i] = true;
    } else if (rank == 0) {
      problem(ds.status().ToString());
    }
  }

  // The opens are collective, so their outcome is the same everywhere; the
  // minimum over ranks makes sure of it before the reads are dealt.
  std::vector<int> open_flags(opened.begin(), opened.end());
  MPI_Allreduce(MPI_IN_PLACE, open_flags.data(), static_cast<int>(open_flags.size()), MPI_INT,
                MPI_MIN, comm);
  for (size_t i = 0; i < opened.size(); ++i) opened[i] = open_flags[i] != 0;

  // 4. Read this rank's share, box by box.
  const std::vector<BoxRead> reads = PlanReads(m, opened, chunk_bytes);
  const std::vector<int> owner = DealReads(reads, size);
  uint64_t my_bytes = 0, largest = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (owner[i] != rank) continue;
    my_bytes += reads[i].bytes;
    largest = std::max(largest, reads[i].largest_slab);
  }
  progress.Start(fmt::format("verify step {} (rank 0 of {})", step, size), my_bytes);
  std::vector<std::byte> buffer(static_cast<size_t>(largest));
  std::vector<std::string> read_problems;
  uint64_t read_bytes = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (owner[i] != rank) continue;
    std::string why = ReadBox(m, reads[i], datasets[reads[i].array], buffer, rank, progress);
    if (why.empty())
      read_bytes += reads[i].bytes;
    else
      read_problems.push_back(std::move(why));
  }
  progress.Clear();
  datasets.clear();  // close the datasets before the file
  Status closed = file->Close();
  if (!closed.ok())
    read_problems.push_back(fmt::format("step {}: close: {}", step, closed.ToString()));

  // 5. Gather.
  for (std::string& p : GatherStrings(read_problems, 0, comm)) {
    report.problems.push_back(std::move(p));
  }
  MPI_Reduce(&read_bytes, &report.bytes_read, 1, MPI_UINT64_T, MPI_SUM, 0, comm);
  return report;
}

// Rank 0: the steps to verify, and problems found in the listing.
Status ChooseSteps(const VerifyArgs& args, std::vector<int64_t>* steps,
                   std::vector<std::string>* problems) {
  if (!io::PathExists(args.root))
    return NotFound(fmt::format("no checkpoint root '{}'", args.root));
  if (args.step) {
    steps->push_back(*args.step);
    return OkStatus();
  }
  MHCKPT_ASSIGN_OR_RETURN(std::vector<io::StepEntry> entries, io::ListSteps(args.root));
  std::optional<int64_t> latest;
  for (const io::StepEntry& e : entries) {
    if (e.committed) {
      latest = e.step;
      if (args.all) steps->push_back(e.step);
    } else if (!e.marker.ok()) {
      // A marker that exists but does not parse: never written that way by
      // the atomic commit, so it is damage, not a crashed save.
      problems->push_back(fmt::format("step {}: {}", e.step, e.marker.ToString()));
    }
  }
  if (!args.all && latest) steps->push_back(*latest);
  if (steps->empty() && problems->empty()) {
    return NotFound(fmt::format("no committed step in '{}'", args.root));
  }
  return OkStatus();
}

}  // namespace

Status RunVerify(const VerifyArgs& args, MPI_Comm comm, std::FILE* out) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);

  // 1. Steps, chosen by rank 0.
  std::vector<int64_t> steps;
  std::vector<std::string> problems;
  Status chosen;
  if (rank == 0) chosen = ChooseSteps(args, &steps, &problems);
  MHCKPT_RETURN_IF_ERROR(BroadcastStatus(chosen, 0, comm));
  uint64_t n = steps.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm);
  steps.resize(n);
  MPI_Bcast(steps.data(), static_cast<int>(n), MPI_INT64_T, 0, comm);

  if (rank == 0) {
    for (const std::string& p : problems) fmt::print(out, "invalid commit marker: {}\n", p);
  }
  Progress progress(rank == 0);
  for (int64_t step : steps) {
    const auto t0 = std::chrono::steady_clock::now();
    StepReport r = VerifyStep(args.root, step, args.chunk_bytes, comm, progress);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank != 0) continue;
    fmt::print(out, "step {}: {} arrays, {} boxes, {} read by {} rank{} in {:.2f} s: {}\n", step,
               r.arrays, r.boxes, HumanBytes(r.bytes_read), size, size == 1 ? "" : "s", seconds,
               r.problems.empty() ? "OK"
                                  : fmt::format("DAMAGED ({} problem{})", r.problems.size(),
                                                r.problems.size() == 1 ? "" : "s"));
    for (const std::string& p : r.problems) fmt::print(out, "  {}\n", p);
    problems.insert(problems.end(), r.problems.begin(), r.problems.end());
  }

  Status outcome;
  if (rank == 0) {
    if (!problems.empty()) {
      outcome = DataLoss(fmt::format("{} problem{} in '{}'; first: {}", problems.size(),
                                     problems.size() == 1 ? "" : "s", args.root, problems.front()));
    } else {
      fmt::print(out, "verified {} step{} in {}: OK (structure, readability and checksums)\n",
                 steps.size(), steps.size() == 1 ? "" : "s", args.root);
    }
    std::fflush(out);
  }
  // Why: rank 0 alone saw every rank's problems; all ranks exit alike.
  return BroadcastStatus(outcome, 0, comm);
}

}  // namespace mhckpt::cli
