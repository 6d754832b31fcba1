// Which copy a local restore (coordinator/local_restore.cc) reads a piece
// of a writer's file from, and what it tries after a source could not
// serve it whole: another node's copy, then the file rebuilt from its
// parity group. Every rank makes the same choices: they depend only on the
// step's view (LocalStep, agreed at Open or commit) and on failures every
// rank has learnt.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/local_nodes.h"

namespace mhckpt::internal {

struct LocalStep;

class LocalSources {
 public:
  /// Who serves a piece: rank `server`, from its node's copy of the file,
  /// or (`rebuilt`) from the file rebuilt from parity in its memory.
  struct Source {
    int server = 0;
    bool rebuilt = false;
  };
  /// What was tried for one piece.
  struct Attempts {
    std::set<int> bad_nodes;    // nodes whose copy of the writer's file failed it
    bool parity_tried = false;  // the rebuild from parity failed it
    std::vector<std::string> tried;
  };

  LocalSources(const Nodes& nodes, const LocalStep& s) : nodes_(nodes), s_(s) {}

  /// The first source of a piece of writer `writer`'s file that `asker`
  /// asks for: the asker if its node holds the file, else one of the
  /// holders, picked by the asker's rank so that the load spreads.
  [[nodiscard]] Source First(int writer, int asker) const;
  /// After `failed` could not serve a piece of `writer`'s file for `asker`
  /// (`why`, recorded in `a`): a holder on a node not tried yet, else the
  /// file rebuilt from parity, else nullopt (no source left).
  std::optional<Source> Next(int writer, int asker, Source failed, const std::string& why,
                             Attempts* a);
  /// The parity group of writer `w` (of two or more), or null.
  [[nodiscard]] const std::vector<int>* GroupOf(int w) const;
  /// A rank whose node holds writer `w`'s file, none of it known bad if it
  /// can be: where a rebuild reads `w`'s segments.
  [[nodiscard]] int HolderOf(int w) const;
  /// Why writer `w`'s file has no rebuild from parity, for a DataLoss
  /// message ("" if it has one).
  [[nodiscard]] std::string NoParityReason(int w) const;

 private:
  const Nodes& nodes_;
  const LocalStep& s_;
  std::map<int, std::set<int>> bad_file_nodes_;  // writer -> nodes (agreed)
};

}  // namespace mhckpt::internal
