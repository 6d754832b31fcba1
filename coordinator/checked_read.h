// Reads of a committed step that check every byte they return: the restore's
// read path (coordinator/restore.cc). A stored box of a version-2 step is cut
// into chunks of whole rows, each with its own checksum in the commit marker
// (docs/FORMAT.md); a read of any part of it reads the whole chunks around
// that part, checks each, and copies out the part asked for.
//
// Reads are queued in a batch and made together (StepReader::ReadMany), so
// that a reader by offset can sort and join the reads of many small arrays;
// each read's checks and copies run as soon as its bytes are in, on the
// reader's thread that read them (ReadRequest::on_read), while the others
// are read. Errors are reported as if every check followed every read, in
// the order the reads were queued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "io/marker.h"
#include "io/step_index.h"
#include "io/storage.h"

namespace mhckpt::internal {

/// Bytes moved by checked reads, for tests and benchmarks.
struct CheckedReadStats {
  uint64_t read = 0;     ///< read from storage (whole chunks)
  uint64_t checked = 0;  ///< of them, hashed and compared with the marker
};

/// Format 3: the checksums of stored boxes, read from the step's index when
/// a batch first needs them (only those boxes' records) into the marker.
class IndexSource {
 public:
  /// `m` must outlive this, and the batches using it.
  IndexSource(std::string path, io::Marker* m) : path_(std::move(path)), m_(m) {}
  /// Loads the records of those of `boxes` (pointers into the marker's
  /// arrays) not yet loaded.
  Status Load(std::span<const std::pair<const io::MarkerArray*, const io::MarkerBox*>> boxes);
  /// Bytes of the records loaded so far.
  [[nodiscard]] uint64_t records() const { return records_; }
  /// The step's subfiles (Marker::files): then every read needs the records
  /// of its stored boxes, checked or not, for their places.
  [[nodiscard]] int files() const { return m_->files; }

 private:
  std::string path_;
  io::Marker* m_;
  std::optional<io::IndexLayout> layout_;
  uint64_t records_ = 0;
};

/// Reads queued, and the checks and copies that follow them.
class ReadBatch {
 public:
  /// Bounce bytes (for chunks that do not lie whole in a destination) a
  /// batch holds before Add flushes it; one larger chunk group is let in.
  static constexpr uint64_t kBounceBytes = uint64_t{64} << 20;
  /// Chunks read straight into a destination go in reads of at most this
  /// many bytes (one larger chunk is let in), each checked as soon as it is
  /// in while the next ones are read.
  static constexpr uint64_t kGroupBytes = uint64_t{16} << 20;

  /// `format_version`: the marker's; `verify`: check checksums
  /// (RestoreOptions::verify_checksums); `index`: for a version-3 step with
  /// `verify` or with subfiles, where the checksums and the boxes' places
  /// come from. With subfiles every read is of one stored box, opened on
  /// first use (StepReader::OpenBox), whether checked or not.
  ReadBatch(io::StepReader& reader, int format_version, bool verify,
            CheckedReadStats* stats = nullptr, IndexSource* index = nullptr)
      : reader_(reader), version_(format_version), verify_(verify), stats_(stats), index_(index) {}

  /// Queues the read of `want` of array `a` (opened as `handle`) into the
  /// row-major buffer `out`, which must stay valid until Flush. In a
  /// version-2 step with `verify`: the whole chunks of every stored box
  /// `want` overlaps — those lying whole in `want` as a run of its rows
  /// straight into `out`, the others into the batch's bounce memory, to be
  /// copied out. In a version-1 step with `verify`, only a read covering
  /// stored boxes whole (a box, or a run of whole rows of it) is checked.
  /// Flushes when the bounce memory is full: that flush's error.
  Status Add(size_t handle, const io::MarkerArray& a, const Box& want, std::byte* out);

  /// Reads everything queued, checking and copying out each read once it is
  /// in. The reader's first error, or (the first in the order queued)
  /// DataLoss naming the array, the stored box, the chunk and the rank that
  /// wrote it on a mismatch.
  Status Flush();

 private:
  struct Item {
    size_t handle = 0;
    const io::MarkerArray* a = nullptr;
    Box box;                   // read into dst
    std::byte* dst = nullptr;  // or, if null, bounce_ + bounce_at
    size_t bounce_at = 0;
    const io::MarkerBox* stored = nullptr;  // `box` is a run of its chunks, to check
    bool bounced = false;                   // copy the part in `want` to `out`
    Box want;
    std::byte* out = nullptr;
    bool whole_boxes = false;  // version 1: check the stored boxes it covers
  };

  Status AddStoredBox(size_t handle, const io::MarkerArray& a, const io::MarkerBox& b,
                      const Box& want, std::byte* out);
  Status Finish(const Item& item, std::byte* dst) const;
  [[nodiscard]] bool subfiles() const { return index_ != nullptr && index_->files() > 0; }
  // With subfiles: the read of `item`, in its stored box's own dataset.
  Result<io::ReadRequest> InSubfile(const Item& item, void* data);

  io::StepReader& reader_;
  int version_;
  bool verify_;
  CheckedReadStats* stats_;
  IndexSource* index_;
  std::vector<Item> items_;
  size_t bounce_bytes_ = 0;
  std::vector<std::byte> bounce_;                       // kept between flushes
  std::map<const io::MarkerBox*, size_t> box_handles_;  // with subfiles: opened boxes
};

/// The elements boxes `a` and `b` share (they intersect: BoxesIntersect).
Box Intersection(const Box& a, const Box& b);

/// Copies `region` (inside both boxes) from the row-major bytes of `src_box`
/// at `src` to those of `dst_box` at `dst`; elements of `elem` bytes.
void CopyRegion(const std::byte* src, const Box& src_box, std::byte* dst, const Box& dst_box,
                const Box& region, size_t elem);

}  // namespace mhckpt::internal
