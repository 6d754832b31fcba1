// XOR parity (coordinator/local_redundancy.h), Options::local_parity_group.
//
// The members of a group (ParityGroup, from Nodes::ParityGroups) each keep a
// parity block. Each member's writer file, zero-padded to the group's
// largest, is cut into g-1 segments of `segment` bytes; segment k of member
// i goes into the block of member (i+1+k) mod g, which is the XOR of the
// g-1 segments it gets, one from each other member. A lost member's segment
// k is its block-holder's block XOR the other segments in that block
// (RebuildInputs), so one member per group may be lost.
//
// The arithmetic is here on byte buffers (EncodeBlocks, RebuildOnBuffers:
// what the unit tests check), and distributed: the save's exchange
// (XorParity::BeginSave), and GatherRebuild, which brings the inputs of a
// rebuild to one rank, for Open (RebuildFile: onto that node's disk) and for
// a restore (local_restore.cc: into memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "coordinator/local_redundancy.h"
#include "io/mapped_file.h"

namespace mhckpt::internal {

struct LocalStep;

/// One parity group of a save.
struct ParityGroup {
  std::vector<int> members;  ///< ranks at save, in node order
  uint64_t segment = 0;
  /// `segment` from the sizes of the members' files in `files`.
  ParityGroup(std::vector<int> ranks, const WriterFiles& files);
  /// `segment` from the sizes of the members' files, in member order.
  ParityGroup(std::vector<int> ranks, const std::vector<uint64_t>& member_bytes);
  [[nodiscard]] int size() const { return static_cast<int>(members.size()); }
  /// Which segment of member i the block of member j holds (i != j).
  [[nodiscard]] int SegmentIn(int i, int j) const {
    return ((j - i - 1) % size() + size()) % size();
  }
  /// The member whose block holds segment k of member i.
  [[nodiscard]] int BlockOf(int i, int k) const { return (i + 1 + k) % size(); }
  /// Index of `rank` in members, or -1.
  [[nodiscard]] int IndexOf(int rank) const;
};

/// acc ^= in, over in.size() bytes (acc at least as long).
void XorInto(std::span<std::byte> acc, std::span<const std::byte> in);
/// Segment `k` of `file` (out.size() bytes each) into `out`, zero past the
/// file's end.
void CopySegment(std::span<const std::byte> file, uint64_t k, std::span<std::byte> out);

/// One input of segment k of a lost member: member `member`'s block
/// (`block`), or segment `segment` of member `member`'s file.
struct RebuildInput {
  int member = 0;  ///< index into ParityGroup::members
  bool block = false;
  uint64_t segment = 0;
};
/// What is XORed into segment `k` of member `lost`: the block of member
/// BlockOf(lost, k), then the other members' segments in that block.
std::vector<RebuildInput> RebuildInputs(const ParityGroup& group, int lost, int k);

/// Every member's block from every member's file (in member order).
std::vector<std::vector<std::byte>> EncodeBlocks(
    const ParityGroup& group, const std::vector<std::span<const std::byte>>& files);
/// Member `lost`'s file (`bytes` long) from the others' files and blocks
/// (member order; the lost member's entries are not read).
std::vector<std::byte> RebuildOnBuffers(const ParityGroup& group, int lost, uint64_t bytes,
                                        const std::vector<std::span<const std::byte>>& files,
                                        const std::vector<std::span<const std::byte>>& blocks);

/// Reads segments of the files of a step on this node, each file mapped
/// once.
class SegmentReader {
 public:
  /// Segment `k` (`seg` bytes, zero past the file's end) of the file at
  /// `path` into `out`; zeros and the error if it cannot be opened.
  Status Read(const std::string& path, uint64_t k, uint64_t seg, std::string* out);

 private:
  std::map<std::string, io::MappedFile> mapped_;
};

/// Where a rebuild's input is read: on rank `rank`, at `path`.
struct InputAt {
  std::string path;
  int rank = 0;
};

/// Collective over the ranks that `where` names and `rebuilder`: member
/// `lost`'s file, rebuilt segment by segment into `out` (on `rebuilder`;
/// empty elsewhere). Each input is read by its rank with `read` and sent to
/// the rebuilder on `tag`.
void GatherRebuild(
    const Comm& comm, const ParityGroup& group, int lost, int rebuilder,
    const std::function<InputAt(const RebuildInput&)>& where,
    const std::function<void(const std::string& path, uint64_t k, std::string* out)>& read, int tag,
    std::span<std::byte> out);

/// The group of `groups` (of two or more) that rank `w` is in, or null.
const std::vector<int>* FindParityGroup(const std::vector<std::vector<int>>& groups, int w);

/// Restore, collective (the same `writers` on every rank): each writer's
/// file of local step `s` rebuilt from its group's parity in the memory of
/// its rebuilder (`s.holders[w].front()`), into `rebuilt` there. Each rank
/// first says which parity blocks its node holds whole (one all-gather);
/// each block is read by the lowest rank holding it, each member's segments
/// by `holder_of(member)`. A writer whose group lacks a block gets its
/// DataLoss in `errors`, on every rank; an input that cannot be read counts
/// as zeros (logged; the rebuilt chunks then fail their checks).
void RebuildInMemory(const Comm& comm, const LocalPaths& paths, const LocalStep& s,
                     const std::set<int>& writers, const std::function<int(int)>& holder_of,
                     SegmentReader* reader, std::map<int, std::vector<std::byte>>* rebuilt,
                     std::map<int, Status>* errors);

/// Open: rank `lost`'s file of local step `s` rebuilt from its group's
/// parity onto the disk of `rebuilder`'s node, each input sent by the
/// lowest rank holding it (`parity_holders` per block, `s.holders` per
/// file). Collective over the group's holders and the rebuilder.
Status RebuildFile(const Comm& comm, const LocalPaths& paths, const LocalStep& s, int lost,
                   int rebuilder, const std::vector<std::vector<int>>& parity_holders);

class XorParity : public LocalRedundancy {
 public:
  XorParity(const Nodes& nodes, LocalPaths paths, int group_size)
      : nodes_(nodes), paths_(std::move(paths)), groups_(nodes.ParityGroups(group_size)) {}

  void AddRewritten(int rank, std::set<std::string>* names) const override;
  [[nodiscard]] std::vector<int> Unprotected() const override;
  [[nodiscard]] std::vector<int> Holders(int w) const override;
  [[nodiscard]] std::vector<std::vector<int>> Groups() const override { return groups_; }
  Result<std::unique_ptr<RedundancySave>> BeginSave(int rank, int64_t step,
                                                    const WriterFiles& files) const override;

 private:
  const Nodes& nodes_;
  const LocalPaths paths_;
  const std::vector<std::vector<int>> groups_;
};

}  // namespace mhckpt::internal
