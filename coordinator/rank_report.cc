#include "coordinator/rank_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "coordinator/agree.h"

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
  size_t chunk_bytes = box.size();
  if (!b.box.count.empty() && b.box.count[0] > 0) {
    chunk_bytes = box.size() / static_cast<size_t>(b.box.count[0]) *
                  static_cast<size_t>(std::max<int64_t>(b.chunk_rows, 1));
  }
  sum.chunks.reserve(b.chunks.size());
  sum.sum = ChecksumChunks(box.data(), box.size(), std::max<size_t>(chunk_bytes, 1), &sum.chunks);
  return sum;
}

}  // namespace mhckpt::internal
