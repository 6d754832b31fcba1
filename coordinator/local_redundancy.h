// Redundancy of the local tier (coordinator/local_tier.h): how a local step
// survives the loss of a node. Two schemes, one interface:
//   - partner copies (coordinator/local_copies.h): each rank's file is
//     copied whole to the rank at its position on the next
//     Options::local_copies nodes of the ring;
//   - XOR parity (coordinator/local_parity.h): the ranks at one position on
//     a run of Options::local_parity_group nodes form a group, and each
//     keeps a parity block from which any one lost member's file is rebuilt.
// Where the partners and groups are is the placement's (coordinator/
// local_nodes.h); LocalTier drives the save through this interface and
// never asks which scheme it has.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "base/comm.h"
#include "base/status.h"
#include "coordinator/checkpoint_manager.h"
#include "coordinator/local_nodes.h"
#include "coordinator/local_store.h"

namespace mhckpt::internal {

// The tags of the copies of writer files, the parity segments and the
// pieces of a rebuild (point to point, on the I/O thread's communicator,
// between two agreements: nothing else is in flight).
inline constexpr int kCopyTag = 7101;
inline constexpr int kPieceTag = 7102;  // a restore's pieces (local_restore.cc)
inline constexpr int kParityTag = 7103;
inline constexpr int kRebuildTag = 7104;      // a rebuild on disk, at Open
inline constexpr int kParityPieceTag = 7105;  // a rebuild in memory, at a restore

/// One save's exchange on one rank (save steps 2-3).
class RedundancySave {
 public:
  virtual ~RedundancySave() = default;
  /// Save step 3: posts this rank's sends (from `own`, its writer file) and
  /// its receives; the caller waits for `requests`.
  virtual void Post(const Comm& comm, std::span<const std::byte> own,
                    std::vector<MPI_Request>* requests) = 0;
  /// After the requests completed: what this rank received, finished,
  /// closed and durable.
  virtual Status Finish() = 0;
};

class LocalRedundancy {
 public:
  virtual ~LocalRedundancy() = default;
  /// Adds the names in a step directory that rank `rank` writes at a save
  /// besides its own writer file (what a recycled directory keeps).
  virtual void AddRewritten(int rank, std::set<std::string>* names) const = 0;
  /// The ranks whose boxes live on their own node only, ascending.
  [[nodiscard]] virtual std::vector<int> Unprotected() const = 0;
  /// The ranks whose node holds writer `w`'s file once a save committed,
  /// ascending.
  [[nodiscard]] virtual std::vector<int> Holders(int w) const = 0;
  /// The parity groups kept with a step (parity.json); empty for copies.
  [[nodiscard]] virtual std::vector<std::vector<int>> Groups() const = 0;
  /// Save step 2 on rank `rank`: maps what it will receive for step `step`.
  virtual Result<std::unique_ptr<RedundancySave>> BeginSave(int rank, int64_t step,
                                                            const WriterFiles& files) const = 0;
  /// After a retention: lets go of what it keeps of deleted files.
  virtual void ForgetDeleted() {}
};

/// The scheme Options ask for: parity if Options::local_parity_group > 0,
/// else Options::local_copies partner copies.
std::unique_ptr<LocalRedundancy> MakeLocalRedundancy(const Options& options, const Nodes& nodes,
                                                     const LocalPaths& paths);

}  // namespace mhckpt::internal
