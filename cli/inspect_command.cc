#include "cli/inspect_command.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "cli/step_info.h"
#include "cli/text_format.h"
#include "io/layout.h"

namespace mhckpt::cli {
namespace {

uint64_t ArrayBytes(const io::MarkerArray& a) {
  return static_cast<uint64_t>(Volume(a.shape).value_or(0)) * DTypeSize(a.dtype);
}

void PrintJson(const InspectArgs& args, const io::Marker& m, uint64_t bytes_on_disk,
               std::FILE* out) {
  nlohmann::json arrays = nlohmann::json::array();
  for (const io::MarkerArray& a : m.arrays) {
    nlohmann::json boxes = nlohmann::json::array();
    for (const io::MarkerBox& b : a.boxes) {
      boxes.push_back({{"start", b.box.start},
                       {"count", b.box.count},
                       {"writer", b.writer},
                       {"checksum", ChecksumToString(b.checksum)}});
    }
    arrays.push_back({{"name", a.name},
                      {"dtype", std::string(DTypeName(a.dtype))},
                      {"shape", a.shape},
                      {"replicated", a.replicated},
                      {"bytes", ArrayBytes(a)},
                      {"boxes", std::move(boxes)}});
  }
  nlohmann::json j{{"root", args.root},
                   {"step", m.step},
                   {"format_version", m.format_version},
                   {"world_size", m.world_size},
                   {"created_unix_ms", m.created_unix_ms},
                   {"created", LocalTime(m.created_unix_ms)},
                   {"data_file", io::DataPath(args.root, m.step)},
                   {"subfiles", m.files},
                   {"array_bytes", m.total_bytes},
                   {"bytes_on_disk", bytes_on_disk},
                   {"user_metadata", m.user_metadata},
                   {"arrays", std::move(arrays)}};
  fmt::print(out, "{}\n", j.dump(2));
}

void PrintText(const InspectArgs& args, const io::Marker& m, uint64_t bytes_on_disk,
               std::FILE* out) {
  fmt::print(out, "step {} in {}: committed\n", m.step, args.root);
  fmt::print(out, "  saved by {} rank{} at {}; format version {}\n", m.world_size,
             m.world_size == 1 ? "" : "s", LocalTime(m.created_unix_ms), m.format_version);
  fmt::print(out, "  {} arrays, {} of data in {}{} ({} on disk)\n", m.arrays.size(),
             HumanBytes(m.total_bytes), io::DataPath(args.root, m.step),
             m.files > 0
                 ? fmt::format(" and {} subfile{} beside it", m.files, m.files == 1 ? "" : "s")
                 : "",
             HumanBytes(bytes_on_disk));
  fmt::print(out, "  user metadata:{}\n", m.user_metadata.empty() ? " (none)" : "");
  for (const auto& [key, value] : m.user_metadata) fmt::print(out, "    {} = {}\n", key, value);
  fmt::print(out, "\n");
  size_t name_w = 4, shape_w = 5;
  for (const io::MarkerArray& a : m.arrays) {
    name_w = std::max(name_w, a.name.size());
    shape_w = std::max(shape_w, ShapeToString(a.shape).size());
  }
  fmt::print(out, "  {:<{}}  {:<13}  {:<{}}  {:>10}  {}\n", "NAME", name_w, "DTYPE", "SHAPE",
             shape_w, "BYTES", "BOXES (writer rank)");
  for (const io::MarkerArray& a : m.arrays) {
    std::string boxes;
    const bool one_writer = a.replicated && a.boxes.size() <= 1;
    if (one_writer) {
      boxes = fmt::format("replicated (rank {})", a.boxes.empty() ? 0 : a.boxes[0].writer);
    } else if (a.replicated) {  // replica-parallel saving: row slices
      boxes = fmt::format("replicated, {} slices", a.boxes.size());
    } else if (a.boxes.empty()) {
      boxes = "none (empty array)";
    } else {
      boxes = fmt::format("{} box{}", a.boxes.size(), a.boxes.size() == 1 ? "" : "es");
    }
    fmt::print(out, "  {:<{}}  {:<13}  {:<{}}  {:>10}  {}\n", a.name, name_w, DTypeName(a.dtype),
               ShapeToString(a.shape), shape_w, HumanBytes(ArrayBytes(a)), boxes);
    if (one_writer) continue;
    for (const io::MarkerBox& b : a.boxes) {
      fmt::print(out, "  {:<{}}  {} (rank {})\n", "", name_w + shape_w + 31, BoxToString(b.box),
                 b.writer);
    }
  }
}

}  // namespace

Status RunInspect(const InspectArgs& args, std::FILE* out) {
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<io::RootStore> store, OpenRoot(args.root));
  MHCKPT_ASSIGN_OR_RETURN(io::Marker m, ReadCommittedStep(*store, args.step));
  const uint64_t bytes_on_disk = store->StepBytes(m.step);
  if (args.json)
    PrintJson(args, m, bytes_on_disk, out);
  else
    PrintText(args, m, bytes_on_disk, out);
  return OkStatus();
}

}  // namespace mhckpt::cli
