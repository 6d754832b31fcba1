#include "cli/list_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/step_info.h"
#include "cli/text_format.h"
#include "coordinator/local_tier.h"
#include "io/layout.h"
#include "io/mapped_file.h"

namespace mhckpt::cli {

namespace {

// A step of this node's local tier: the ranks whose files the node holds
// whole (the expected size for the step's plan).
struct LocalStepInfo {
  StepInfo info;
  std::vector<int> files;
};

Result<std::vector<LocalStepInfo>> ReadLocalSteps(const std::string& dir) {
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<io::RootStore> store, OpenRoot(dir));
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, ReadSteps(*store));
  std::vector<LocalStepInfo> out;
  for (StepInfo& s : steps) {
    LocalStepInfo& l = out.emplace_back();
    if (s.marker) {
      const internal::WriterFiles files(*s.marker);
      for (int w = 0; w < s.marker->world_size; ++w) {
        Result<uint64_t> size = io::MappedFile::Size(io::StepDir(dir, s.entry.step) + "/" +
                                                     internal::WriterFileName(w));
        if (size.ok() && *size == files.bytes[static_cast<size_t>(w)]) l.files.push_back(w);
      }
    }
    l.info = std::move(s);
  }
  return out;
}

}  // namespace

Status RunList(const ListArgs& args, std::FILE* out) {
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<io::RootStore> store, OpenRoot(args.root));
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, ReadSteps(*store));
  std::vector<LocalStepInfo> local;
  if (!args.local_dir.empty()) {
    MHCKPT_ASSIGN_OR_RETURN(local, ReadLocalSteps(args.local_dir));
  }
  if (args.json) {
    nlohmann::json j{{"root", args.root}, {"steps", nlohmann::json::array()}};
    if (!args.local_dir.empty()) {
      nlohmann::json l{{"dir", args.local_dir}, {"steps", nlohmann::json::array()}};
      for (const LocalStepInfo& s : local) {
        l["steps"].push_back({{"step", s.info.entry.step},
                              {"state", StepState(s.info.entry)},
                              {"world_size", s.info.marker ? s.info.marker->world_size : 0},
                              {"files_of_ranks", s.files}});
      }
      j["local"] = std::move(l);
    }
    for (const StepInfo& s : steps) {
      nlohmann::json e{{"step", s.entry.step},
                       {"state", StepState(s.entry)},
                       {"committed", s.entry.committed},
                       {"bytes_on_disk", s.bytes_on_disk},
                       {"world_size", nullptr},
                       {"created_unix_ms", nullptr},
                       {"created", nullptr},
                       {"arrays", nullptr},
                       {"array_bytes", nullptr},
                       {"error", nullptr}};
      if (s.marker) {
        e["world_size"] = s.marker->world_size;
        e["created_unix_ms"] = s.marker->created_unix_ms;
        e["created"] = LocalTime(s.marker->created_unix_ms);
        e["arrays"] = s.marker->arrays.size();
        e["array_bytes"] = s.marker->total_bytes;
      }
      if (!s.entry.marker.ok()) e["error"] = s.entry.marker.ToString();
      j["steps"].push_back(std::move(e));
    }
    fmt::print(out, "{}\n", j.dump(2));
    return OkStatus();
  }

  size_t committed = 0;
  for (const StepInfo& s : steps) committed += s.entry.committed ? 1 : 0;
  fmt::print(out, "{}: {} step{}, {} committed\n", args.root, steps.size(),
             steps.size() == 1 ? "" : "s", committed);
  if (steps.empty()) return OkStatus();
  fmt::print(out, "{:>12}  {:<14}  {:>10}  {:>5}  {:<19}  {}\n", "STEP", "STATE", "ON DISK",
             "WORLD", "CREATED", "ARRAYS");
  for (const StepInfo& s : steps) {
    std::string world = "-", created = "-", arrays = "-";
    if (s.marker) {
      world = std::to_string(s.marker->world_size);
      created = LocalTime(s.marker->created_unix_ms);
      arrays = fmt::format("{} ({})", s.marker->arrays.size(), HumanBytes(s.marker->total_bytes));
    }
    fmt::print(out, "{:>12}  {:<14}  {:>10}  {:>5}  {:<19}  {}\n", s.entry.step, StepState(s.entry),
               HumanBytes(s.bytes_on_disk), world, created, arrays);
    if (!s.entry.marker.ok()) fmt::print(out, "{:>12}  ! {}\n", "", s.entry.marker.ToString());
  }
  if (args.local_dir.empty()) return OkStatus();
  fmt::print(out, "{} (this node's local tier): {} step{}\n", args.local_dir, local.size(),
             local.size() == 1 ? "" : "s");
  if (local.empty()) return OkStatus();
  fmt::print(out, "{:>12}  {:<14}  {:>5}  {}\n", "STEP", "STATE", "WORLD", "FILES OF RANKS");
  for (const LocalStepInfo& s : local) {
    fmt::print(out, "{:>12}  {:<14}  {:>5}  {}\n", s.info.entry.step, StepState(s.info.entry),
               s.info.marker ? std::to_string(s.info.marker->world_size) : "-",
               fmt::format("{}", fmt::join(s.files, ",")));
  }
  return OkStatus();
}

}  // namespace mhckpt::cli
