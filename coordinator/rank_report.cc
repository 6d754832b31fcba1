#include "coordinator/rank_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "coordinator/agree.h"
#include "io/step_index.h"

namespace mhckpt::internal {
namespace {

Status DecodeReport(const std::string& bytes, std::vector<BoxSum>* sums) {
  try {
    nlohmann::json j = nlohmann::json::from_cbor(bytes);
    for (const auto& b : j.at(2)) {
      sums->push_back(BoxSum{b.at(0).get<uint32_t>(), b.at(1).get<uint32_t>(),
                             b.at(2).get<uint64_t>(), b.at(3).get<std::vector<uint64_t>>()});
    }
    std::optional<StatusCode> code = StatusCodeFromInt(j.at(0).get<int64_t>());
    if (!code) {
      return Internal(
          fmt::format("a rank's report has the unknown status code {}", j.at(0).dump()));
    }
    return Status(*code, j.at(1).get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    return Internal(fmt::format("cannot decode a rank's report: {}", e.what()));
  }
}

}  // namespace

std::string EncodeReport(const Status& s, const std::vector<BoxSum>& sums) {
  nlohmann::json j =
      nlohmann::json::array({static_cast<int>(s.code()), s.message(), nlohmann::json::array()});
  for (const BoxSum& b : sums) j[2].push_back({b.array, b.box, b.sum, b.chunks});
  std::vector<uint8_t> cbor = nlohmann::json::to_cbor(j);
  return {cbor.begin(), cbor.end()};
}

Status CollectReports(const std::vector<std::string>& reports,
                      std::vector<std::vector<BoxSum>>* sums) {
  Status first;
  int failed = 0;
  sums->assign(reports.size(), {});
  for (size_t r = 0; r < reports.size(); ++r) {
    Status s = DecodeReport(reports[r], &(*sums)[r]);
    if (!s.ok() && failed++ == 0) first = s;
  }
  return WithFailedCount(first, failed);
}

BoxSum BoxChecksums(const io::MarkerArray& a, size_t ai, size_t bi,
                    std::span<const std::byte> box) {
  const io::MarkerBox& b = a.boxes[bi];
  BoxSum sum{static_cast<uint32_t>(ai), static_cast<uint32_t>(bi), 0, {}};
  sum.chunks.reserve(b.chunks.size());
  sum.sum = ChecksumChunks(box.data(), box.size(), BoxChunkBytes(b, box.size()), &sum.chunks);
  return sum;
}

size_t BoxChunkBytes(const io::MarkerBox& b, size_t box_bytes) {
  size_t chunk_bytes = box_bytes;
  if (!b.box.count.empty() && b.box.count[0] > 0) {
    chunk_bytes = box_bytes / static_cast<size_t>(b.box.count[0]) *
                  static_cast<size_t>(std::max<int64_t>(b.chunk_rows, 1));
  }
  return std::max<size_t>(chunk_bytes, 1);
}

// Rank 0: every (array, box) index that ranks reported lies inside the plan.
Status CheckSumsInPlan(const io::Marker& plan, const std::vector<std::vector<BoxSum>>& sums) {
  for (size_t r = 0; r < sums.size(); ++r) {
    for (const BoxSum& b : sums[r]) {
      if (b.array >= plan.arrays.size() || b.box >= plan.arrays[b.array].boxes.size()) {
        return Internal(
            fmt::format("rank {} reported a checksum of box {} of array {}, which "
                        "the plan does not have",
                        r, b.box, b.array));
      }
    }
  }
  return OkStatus();
}

// Rank 0: every rank's outcome, and the checksums of the boxes each wrote
// into `plan` (steps 5 and 6, and the local tier's commit).
Status FillChecksums(const std::vector<std::string>& reports, io::Marker* plan) {
  std::vector<std::vector<BoxSum>> all;
  MHCKPT_RETURN_IF_ERROR(CollectReports(reports, &all));
  MHCKPT_RETURN_IF_ERROR(CheckSumsInPlan(*plan, all));
  for (const std::vector<BoxSum>& sums : all) {
    for (const BoxSum& b : sums) {
      io::MarkerBox& box = plan->arrays[b.array].boxes[b.box];
      box.checksum = b.sum;
      box.chunks = b.chunks;
    }
  }
  return OkStatus();
}

// Rank 0, format 3: every box's check word from the writers' reports
// (rank_report.h: BoxSum::sum), each box reported exactly once, into the
// marker's index entry.
Status FillIndex(const std::vector<std::string>& reports, const io::IndexLayout& layout,
                 io::Marker* plan) {
  std::vector<std::vector<BoxSum>> all;
  MHCKPT_RETURN_IF_ERROR(CollectReports(reports, &all));
  MHCKPT_RETURN_IF_ERROR(CheckSumsInPlan(*plan, all));
  std::vector<size_t> first(plan->arrays.size() + 1, 0);
  for (size_t i = 0; i < plan->arrays.size(); ++i) {
    first[i + 1] = first[i] + plan->arrays[i].boxes.size();
  }
  std::vector<uint64_t> checks(first.back(), 0);
  std::vector<uint8_t> seen(first.back(), 0);
  for (const std::vector<BoxSum>& sums : all) {
    for (const BoxSum& b : sums) {
      checks[first[b.array] + b.box] = b.sum;
      seen[first[b.array] + b.box] = 1;
    }
  }
  for (size_t i = 0; i < plan->arrays.size(); ++i) {
    for (size_t k = 0; k < plan->arrays[i].boxes.size(); ++k) {
      if (seen[first[i] + k] == 0) {
        const io::MarkerArray& a = plan->arrays[i];
        return Internal(fmt::format("array '{}' box {}: rank {} reported no index record", a.name,
                                    BoxToString(a.boxes[k].box), a.boxes[k].writer));
      }
    }
  }
  plan->index = {layout.total(), io::IndexChecksum(checks)};
  return OkStatus();
}

}  // namespace mhckpt::internal
