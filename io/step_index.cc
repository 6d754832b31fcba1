#include "io/step_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/checksum.h"
#include "base/fault.h"

namespace mhckpt::io {
namespace {

constexpr char kMagic[8] = {'M', 'H', 'C', 'K', 'I', 'D', 'X', '3'};
// Records closer than this are read in one pread (the gap is read and
// dropped); no single read is larger than kMaxReadBytes unless one record is.
constexpr uint64_t kRecordJoinGapBytes = 512;
constexpr uint64_t kMaxReadBytes = 16 << 20;
constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 56;
// With subfiles: a record ends in the box's subfile and offset in it.
constexpr uint64_t kPlaceBytes = 16;
// No box of a subfile may reach past this byte (a forged index).
constexpr uint64_t kMaxFileOffset = uint64_t{1} << 62;

void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out->append(b, 8);
}

uint64_t GetU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

uint64_t CheckWord(size_t array, size_t box, const void* data, size_t bytes) {
  return XXH3_64bits_withSeed(data, bytes, (static_cast<uint64_t>(array) << 32) | box);
}

// A file descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads up to `n` bytes at `offset`: fewer only where the file ends.
Result<size_t> ReadUpTo(int fd, const std::string& path, uint64_t offset, std::byte* out,
                        size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return IoError(fmt::format("read '{}': {}", path, std::strerror(errno)));
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

Status ReadAt(int fd, const std::string& path, uint64_t offset, std::byte* out, size_t n) {
  MHCKPT_ASSIGN_OR_RETURN(size_t done, ReadUpTo(fd, path, offset, out, n));
  if (done < n) {
    return DataLoss(fmt::format("index '{}' ends at byte {}, before the records the marker lists",
                                path, offset + done));
  }
  return OkStatus();
}

// Decodes the record of box `b` of array `ai`, `n` bytes at `p`, into `box`;
// with `files` (Marker::files) > 0 it ends in the box's place.
Status DecodeRecord(const std::string& path, const MarkerArray& a, size_t ai, size_t bi,
                    const std::byte* p, size_t n, int files, MarkerBox* box) {
  const uint64_t check = GetU64(p + n - 8);
  if (CheckWord(ai, bi, p, n - 8) != check) {
    return DataLoss(fmt::format(
        "index '{}': the record of array '{}' box {} (written by rank {}) fails its check", path,
        a.name, BoxToString(box->box), box->writer));
  }
  box->checksum = GetU64(p);
  const size_t place = files > 0 ? kPlaceBytes : 0;
  box->chunks.resize((n - 16 - place) / 8);
  for (size_t c = 0; c < box->chunks.size(); ++c) box->chunks[c] = GetU64(p + 8 + 8 * c);
  if (files == 0) return OkStatus();
  const uint64_t file = GetU64(p + n - 24), offset = GetU64(p + n - 16);
  // The box's bytes must lie in one of the step's subfiles, below 2^62.
  const uint64_t bytes = BoxBytes(box->box, a.dtype);
  if (file >= static_cast<uint64_t>(files) || offset > kMaxFileOffset ||
      bytes > kMaxFileOffset - offset) {
    return DataLoss(fmt::format(
        "index '{}': array '{}' box {} (written by rank {}) is placed at byte {} of subfile {} "
        "of {}",
        path, a.name, BoxToString(box->box), box->writer, offset, file, files));
  }
  box->file = static_cast<int64_t>(file);
  box->file_offset = static_cast<int64_t>(offset);
  return OkStatus();
}

Result<int> OpenIndex(const std::string& path, int64_t step, Fd* fd) {
  fd->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd->fd < 0) {
    if (errno == ENOENT) return DataLoss(fmt::format("index '{}' is missing", path));
    return IoError(fmt::format("open '{}': {}", path, std::strerror(errno)));
  }
  std::byte header[kIndexHeaderBytes];
  MHCKPT_RETURN_IF_ERROR(ReadAt(fd->fd, path, 0, header, sizeof header));
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0 ||
      static_cast<int64_t>(GetU64(header + 8)) != step) {
    return DataLoss(fmt::format("index '{}' is not the index of step {}", path, step));
  }
  return fd->fd;
}

}  // namespace

Result<IndexLayout> IndexLayout::Of(const Marker& m, const std::string& origin) {
  IndexLayout l;
  size_t boxes = 0;
  for (const MarkerArray& a : m.arrays) boxes += a.boxes.size();
  l.first_.reserve(m.arrays.size());
  l.offsets_.reserve(boxes + 1);
  uint64_t at = kIndexHeaderBytes;
  for (const MarkerArray& a : m.arrays) {
    l.first_.push_back(l.offsets_.size());
    for (const MarkerBox& b : a.boxes) {
      l.offsets_.push_back(at);
      const auto chunks = static_cast<uint64_t>(ChunkCount(b.box, b.chunk_rows));
      const uint64_t place = m.files > 0 ? kPlaceBytes : 0;
      if (chunks > kMaxIndexBytes / 8 || (at += 16 + place + 8 * chunks) > kMaxIndexBytes) {
        return DataLoss(fmt::format(
            "commit marker '{}': array '{}': its boxes' checksums would take more than {} bytes",
            origin, a.name, kMaxIndexBytes));
      }
    }
  }
  l.offsets_.push_back(at);
  return l;
}

std::string IndexHeader(int64_t step) {
  std::string h(kMagic, sizeof kMagic);
  PutU64(&h, static_cast<uint64_t>(step));
  return h;
}

uint64_t AppendIndexRecord(size_t array, size_t box, uint64_t checksum,
                           std::span<const uint64_t> chunks, std::string* out,
                           const std::optional<BoxPlace>& place) {
  const size_t start = out->size();
  PutU64(out, checksum);
  for (uint64_t c : chunks) PutU64(out, c);
  if (place) {
    PutU64(out, place->file);
    PutU64(out, place->offset);
  }
  const uint64_t check = CheckWord(array, box, out->data() + start, out->size() - start);
  PutU64(out, check);
  return check;
}

Status PutIndexRanges(const std::string& path,
                      std::span<const std::pair<uint64_t, std::string>> ranges) {
  Fd fd;
  fd.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd.fd < 0) return IoError(fmt::format("open '{}': {}", path, std::strerror(errno)));
  for (const auto& [at, bytes] : ranges) {
    size_t done = 0;
    while (done < bytes.size()) {
      errno = fault::Errno("index_write");
      ssize_t n = errno != 0 ? -1
                             : ::pwrite(fd.fd, bytes.data() + done, bytes.size() - done,
                                        static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError(fmt::format("write '{}': {}", path, std::strerror(errno)));
      done += static_cast<size_t>(n);
    }
  }
  MHCKPT_RETURN_IF_ERROR(fault::Hit("index_write"));
  if (::fsync(fd.fd) != 0)
    return IoError(fmt::format("fsync '{}': {}", path, std::strerror(errno)));
  return OkStatus();
}

uint64_t IndexChecksum(std::span<const uint64_t> checks) {
  std::string bytes;
  bytes.reserve(checks.size() * 8);
  for (uint64_t c : checks) PutU64(&bytes, c);
  return Checksum(bytes.data(), bytes.size());
}

Status LoadIndexRecords(const std::string& path, const IndexLayout& layout,
                        std::span<const BoxRef> boxes, Marker* m, uint64_t* bytes_read) {
  std::vector<BoxRef> todo(boxes.begin(), boxes.end());
  std::sort(todo.begin(), todo.end());
  todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
  if (todo.empty()) return OkStatus();
  Fd fd;
  MHCKPT_RETURN_IF_ERROR(OpenIndex(path, m->step, &fd).status());
  if (bytes_read != nullptr) *bytes_read += kIndexHeaderBytes;
  // A record past the file's end is refused before anything is sized from
  // it: a forged marker can make one record of any size up to 2^56 bytes.
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) {
    return IoError(fmt::format("stat '{}': {}", path, std::strerror(errno)));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  auto short_file = [&](uint64_t ends, const BoxRef& r) {
    const MarkerArray& a = m->arrays[r.first];
    const MarkerBox& b = a.boxes[r.second];
    return DataLoss(
        fmt::format("index '{}' ends at byte {}, before the end of the record of array '{}' box "
                    "{} (written by rank {})",
                    path, ends, a.name, BoxToString(b.box), b.writer));
  };
  for (const BoxRef& r : todo) {
    if (layout.offset(r.first, r.second) + layout.record_bytes(r.first, r.second) > size) {
      return short_file(size, r);
    }
  }
  std::vector<std::byte> buffer;
  for (size_t i = 0; i < todo.size();) {
    // One read: records i..j-1, each starting within kRecordJoinGapBytes of the
    // last one's end, up to kMaxReadBytes.
    const uint64_t begin = layout.offset(todo[i].first, todo[i].second);
    uint64_t end = begin + layout.record_bytes(todo[i].first, todo[i].second);
    size_t j = i + 1;
    for (; j < todo.size(); ++j) {
      const uint64_t at = layout.offset(todo[j].first, todo[j].second);
      const uint64_t next = at + layout.record_bytes(todo[j].first, todo[j].second);
      if (at > end + kRecordJoinGapBytes || next - begin > kMaxReadBytes) break;
      end = next;
    }
    buffer.resize(end - begin);
    MHCKPT_ASSIGN_OR_RETURN(size_t got, ReadUpTo(fd.fd, path, begin, buffer.data(), buffer.size()));
    if (bytes_read != nullptr) *bytes_read += got;
    for (size_t k = i; k < j; ++k) {
      const auto [ai, bi] = todo[k];
      MarkerArray& a = m->arrays[ai];
      if (layout.offset(ai, bi) + layout.record_bytes(ai, bi) > begin + got) {
        return short_file(begin + got, todo[k]);  // it shrank since the fstat
      }
      MHCKPT_RETURN_IF_ERROR(DecodeRecord(path, a, ai, bi,
                                          buffer.data() + (layout.offset(ai, bi) - begin),
                                          layout.record_bytes(ai, bi), m->files, &a.boxes[bi]));
    }
    i = j;
  }
  return OkStatus();
}

Status LoadIndex(const std::string& path, Marker* m) {
  MHCKPT_ASSIGN_OR_RETURN(IndexLayout layout, IndexLayout::Of(*m, path));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return DataLoss(fmt::format("index '{}' is missing", path));
    return IoError(fmt::format("stat '{}': {}", path, std::strerror(errno)));
  }
  if (static_cast<uint64_t>(st.st_size) != m->index.bytes) {
    return DataLoss(fmt::format("index '{}' is {} bytes; the commit marker says {}", path,
                                st.st_size, m->index.bytes));
  }
  std::vector<BoxRef> all;
  for (size_t a = 0; a < m->arrays.size(); ++a) {
    for (size_t b = 0; b < m->arrays[a].boxes.size(); ++b) {
      all.emplace_back(static_cast<uint32_t>(a), static_cast<uint32_t>(b));
    }
  }
  MHCKPT_RETURN_IF_ERROR(LoadIndexRecords(path, layout, all, m));
  // Every record passed its check; their check words, hashed in order, must
  // be what rank 0 recorded: no record is from another save.
  std::vector<uint64_t> checks;
  checks.reserve(all.size());
  std::string record;
  for (size_t a = 0; a < m->arrays.size(); ++a) {
    for (size_t b = 0; b < m->arrays[a].boxes.size(); ++b) {
      const MarkerBox& box = m->arrays[a].boxes[b];
      record.clear();
      std::optional<BoxPlace> place;
      if (m->files > 0) {
        place = BoxPlace{static_cast<uint64_t>(box.file), static_cast<uint64_t>(box.file_offset)};
      }
      checks.push_back(AppendIndexRecord(a, b, box.checksum, box.chunks, &record, place));
    }
  }
  if (IndexChecksum(checks) != m->index.checksum) {
    return DataLoss(
        fmt::format("index '{}': its records' checksum is {}; the commit marker says {}", path,
                    ChecksumToString(IndexChecksum(checks)), ChecksumToString(m->index.checksum)));
  }
  return OkStatus();
}

}  // namespace mhckpt::io
