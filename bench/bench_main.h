// The main of a benchmark that runs once and reports one JSON object: MPI
// up, flags parsed, the run, rank 0 prints the figures (and writes them to
// a file if asked), MPI down.
#pragma once

#include <mpi.h>

#include <fstream>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"

namespace mhckpt::bench {

/// Parses `app` (a usage error exits with CLI11's code), then calls `run`
/// on every rank. Rank 0 adds "ranks" and "load_average" to what `run`
/// returned, prints it (JSON indented by `indent`, -1: one line) and writes
/// it to `*json_path` when that is not empty (read after parsing, so it may
/// be bound to a flag).
inline int BenchMain(int argc, char** argv, CLI::App& app, const std::string* json_path,
                     const std::function<nlohmann::json()>& run, int indent = 1) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    MPI_Finalize();
    return app.exit(e);
  }
  nlohmann::json out = run();
  if (Rank() == 0) {
    out["ranks"] = Size();
    out["load_average"] = LoadAverage();
    fmt::print("{}\n", out.dump(indent));
    if (!json_path->empty()) std::ofstream(*json_path) << out.dump(indent) << "\n";
  }
  MPI_Finalize();
  return 0;
}

}  // namespace mhckpt::bench
