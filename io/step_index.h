// The index of a format-3 step (docs/FORMAT.md, "index.bin"): every stored
// box's checksum and chunk checksums, in a binary file beside the data, so
// that the commit marker stays as small as the list of arrays.
//
//   header   8 bytes "MHCKIDX3", then the step (int64, little-endian)
//   records  one per box, in marker order (arrays by name, then their boxes):
//            the box's XXH3-64, the XXH3-64 of each of its chunks, in a step
//            with subfiles (Marker::files) the box's subfile and its byte
//            offset there, and a check word: the XXH3-64, seeded with
//            (array << 32 | box), of the record's bytes before it. All
//            little-endian uint64.
//
// A record's place follows from the marker alone (IndexLayout), so each
// writer puts its own boxes' records with pwrite, in parallel, and a reader
// reads with pread only the records of the boxes it reads, each checked by
// its check word (which also ties it to its array and box). The marker
// records the index's size and the XXH3-64 of all check words in order, which
// rank 0 learns from the writers' reports, not by reading the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "io/marker.h"

namespace mhckpt::io {

inline constexpr size_t kIndexHeaderBytes = 16;

/// Where each box's record lies in the index of a format-3 marker.
class IndexLayout {
 public:
  /// DataLoss naming `origin` if the index would be larger than 2^56 bytes
  /// (a damaged or forged marker: nothing is allocated from it).
  static Result<IndexLayout> Of(const Marker& m, const std::string& origin);

  [[nodiscard]] uint64_t offset(size_t array, size_t box) const {
    return offsets_[first_[array] + box];
  }
  [[nodiscard]] uint64_t record_bytes(size_t array, size_t box) const {
    return offsets_[first_[array] + box + 1] - offsets_[first_[array] + box];
  }
  /// The index's size.
  [[nodiscard]] uint64_t total() const { return offsets_.back(); }

 private:
  std::vector<size_t> first_;      // per array: its first box in offsets_
  std::vector<uint64_t> offsets_;  // per box, and the end
};

/// The header of the index of `step`.
std::string IndexHeader(int64_t step);

/// Appends the record of box `box` of array `array` to `out`: its checksum,
/// its chunks', its place (a step with subfiles) and the check word, which
/// it returns.
uint64_t AppendIndexRecord(size_t array, size_t box, uint64_t checksum,
                           std::span<const uint64_t> chunks, std::string* out,
                           const std::optional<BoxPlace>& place = std::nullopt);

/// Puts `ranges` (offset, bytes) into the index file at `path`, creating it
/// if need be (every writer of a step writes its own ranges of the one
/// file), and fsyncs it. IoError naming the file. Fault point `index_write`:
/// an errno action fails the writes; other actions fire after them, before
/// the fsync.
Status PutIndexRanges(const std::string& path,
                      std::span<const std::pair<uint64_t, std::string>> ranges);

/// The check word of every record, in order, hashed: MarkerIndex::checksum.
uint64_t IndexChecksum(std::span<const uint64_t> checks);

/// A box of the marker: (array, box).
using BoxRef = std::pair<uint32_t, uint32_t>;

/// Reads the records of `boxes` (any order, repeats allowed) from the index
/// at `path` into `m`'s boxes (MarkerBox::checksum and chunks): only their
/// byte ranges, sorted, nearby ones in one pread; each record checked.
/// DataLoss naming the file, the array and the box on a short file, a wrong
/// header or a record that fails its check; IoError if it cannot be read.
/// `bytes_read`, if not null, is increased by the bytes read.
Status LoadIndexRecords(const std::string& path, const IndexLayout& layout,
                        std::span<const BoxRef> boxes, Marker* m, uint64_t* bytes_read = nullptr);

/// Reads every record (LoadIndexRecords of every box) and checks the file's
/// size and the marker's index checksum too: for verify.
Status LoadIndex(const std::string& path, Marker* m);

}  // namespace mhckpt::io
