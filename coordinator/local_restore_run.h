// The restore of a local step (coordinator/local_restore.cc: the protocol and
// its steps) as one object per restore, private to its two files:
//   - local_restore.cc: the protocol's order (Run), the pieces every rank
//     computes alike (step 2), and a new source for each piece that failed
//     (step 5);
//   - local_restore_serve.cc: serving the pieces from the node's files and
//     exchanging them (steps 3-4), and the device destinations (step 6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "coordinator/local_parity.h"
#include "coordinator/local_sources.h"
#include "coordinator/local_store.h"
#include "coordinator/local_tier.h"
#include "io/mapped_file.h"
#include "io/marker.h"

namespace mhckpt::internal::local_restore {

// One destination of one rank, as every rank learns it in step 2.
struct Want {
  int rank = 0;
  size_t array = 0;  // into the marker
  size_t dest = 0;   // index of the destination in this rank's request list
  Box box;
};

// One piece: the part of stored box `box` of the want's array that `want`
// asks for, held in writer `writer`'s file, and who serves it now: `server`,
// from its node's copy of that file, or (`rebuilt`) from the file rebuilt
// from parity in its memory. The same list on every rank.
struct Piece {
  const Want* want = nullptr;
  size_t box = 0;
  Box region;
  int writer = 0;
  uint64_t bytes = 0;
  int server = 0;
  bool rebuilt = false;
};

class LocalRestoreRun {
 public:
  LocalRestoreRun(const Comm& comm, const LocalTier& tier, const LocalStep& s,
                  std::span<const ArrayToRestore> arrays, const RestoreOptions& options)
      : comm_(comm),
        tier_(tier),
        s_(s),
        m_(s.marker),
        arrays_(arrays),
        options_(options),
        rank_(comm.rank()),
        files_(m_),
        sources_(tier.nodes(), s) {}

  Status Run();

 private:
  void NameRank(Status* s) const;
  void MakePieces();
  // Host memory for every destination of this rank: the caller's buffer,
  // or a host copy of a device one (filled in at the end).
  void PrepareDestinations();
  std::byte* DestinationOf(const Want& w);
  // The caller's host destinations of this rank, in request order.
  std::vector<std::pair<std::byte*, size_t>> HostDestinations() const;
  // The bytes of writer `writer`'s file as piece `p` is served: this node's
  // copy, mapped once, or the file rebuilt from parity here.
  Result<const std::byte*> FileBytes(const Piece& p);
  // The bytes of piece `p`'s stored box at its source, the chunks around its
  // region checked (once each per source).
  Result<const std::byte*> StoredBytes(const Piece& p);
  // Whether piece `p` is served to this rank by this rank with its bytes one
  // run both in the stored box and in the destination (a restart on the
  // same sharding): then CopyChecked serves it.
  bool CopiedWhileChecked(const Piece& p) const;
  // Such a piece copied from the stored box at `box` into this rank's
  // destination chunk by chunk, each chunk's check riding along (a piece
  // of it hashed from cache right after it is copied) instead of a pass
  // that checks and a pass that copies. A chunk whose check fails leaves
  // its bytes in the destination; step 5 serves the piece again.
  Status CopyChecked(const Piece& p, const std::byte* box);
  // A piece goes as a message of its own, straight from the server's
  // mapped file into the asker's destination, when its bytes are one run on
  // both sides (the same sharding as the save's, say); else it is packed.
  bool Direct(const Piece& p) const;
  // Where a source of piece `p` is, for messages.
  std::string SourceName(const Piece& p) const;
  void Serve();
  // The direct pieces (in piece order) and then one packed message per pair
  // of ranks; MPI keeps the order of messages between two ranks on one tag,
  // and both sides post in the same order.
  void Exchange();
  // 5, collective: every server's failed pieces of this round, on every
  // rank (piece -> what failed). Empty on every rank when none failed.
  std::map<size_t, std::string> GatherFailures();
  // 5: a new source for each failed piece (the same choice on every rank:
  // `failed` is agreed), into `pending`; DataLoss when a piece has none.
  Status ChooseOtherSources(const std::map<size_t, std::string>& failed,
                            std::vector<size_t>* pending);
  // 5, collective: the files of the writers that pieces of `pending` are now
  // to be served from parity for (the same on every rank), rebuilt in the
  // memory of their server (RebuildInMemory). A file that cannot be rebuilt
  // serves no piece (step 5 then has no source left for them).
  void RebuildFromParity(const std::vector<size_t>& pending);
  // Rank 0, after a restore that needed other sources: one line.
  void LogFallbacks() const;
  Status FillDevices();

  const Comm& comm_;
  const LocalTier& tier_;
  const LocalStep& s_;
  const io::Marker& m_;
  const std::span<const ArrayToRestore> arrays_;
  const RestoreOptions& options_;
  const int rank_;
  const WriterFiles files_;

  std::vector<Want> wants_;
  std::vector<Piece> pieces_;  // every rank's, in want order: the same on every rank
  std::vector<size_t> round_;  // this round's pieces this rank serves or receives
  std::vector<std::byte*> dest_;
  std::vector<size_t> dest_start_;  // per request array: its first in dest_
  std::map<size_t, size_t> request_of_array_;
  std::vector<std::vector<std::byte>> device_copies_;  // moves keep their data()
  std::map<int, io::MappedFile> mapped_;               // writer -> its file on this node
  std::map<int, Status> open_errors_;                  // writer -> why its file cannot serve
  // (rebuilt, array, box, chunk) -> the outcome of its check.
  std::map<std::tuple<bool, size_t, size_t, int64_t>, Status> checked_;
  std::map<int, std::string> out_;         // asker -> the packed pieces served to it
  std::vector<MPI_Request> direct_sends_;  // the pieces sent as they are, then the packs
  std::vector<std::byte> zeros_;
  Status local_;  // this rank's first error that is not about the stored bytes

  // Step 5.
  std::vector<std::pair<size_t, std::string>> failed_;  // this round, as server
  LocalSources sources_;                                // agreed choices
  std::map<size_t, LocalSources::Attempts> attempts_;   // agreed
  std::set<int> rebuilds_;                              // writers rebuilt (agreed)
  std::map<int, Status> rebuild_errors_;                // writer -> why not (agreed)
  std::map<int, std::vector<std::byte>> rebuilt_;       // writer -> its file, on its rebuilder
  SegmentReader parity_inputs_;
};

}  // namespace mhckpt::internal::local_restore
