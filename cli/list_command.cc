#include "cli/list_command.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/step_info.h"
#include "cli/text_format.h"

namespace mhckpt::cli {

Status RunList(const ListArgs& args, std::FILE* out) {
  MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<io::RootStore> store, OpenRoot(args.root));
  MHCKPT_ASSIGN_OR_RETURN(std::vector<StepInfo> steps, ReadSteps(*store));
  if (args.json) {
    nlohmann::json j{{"root", args.root}, {"steps", nlohmann::json::array()}};
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
  return OkStatus();
}

}  // namespace mhckpt::cli
