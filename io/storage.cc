#include "io/storage.h"

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/direct_engine.h"
#include "io/h5_engine.h"
#include "io/layout.h"
#include "io/pread_reader.h"
#include "io/read_counters.h"
#include "io/subfile_reader.h"

namespace mhckpt::io {
namespace {

std::atomic<uint64_t> g_bytes_read{0};
std::atomic<uint64_t> g_dataset_opens{0};
std::atomic<uint64_t> g_offset_arrays{0};
std::atomic<uint64_t> g_offset_boxes{0};
std::atomic<uint64_t> g_offset_reads{0};
std::atomic<uint64_t> g_direct_read_bytes{0};

// Counts the bytes every reader returns, whatever the engine behind it.
class CountingReader final : public StepReader {
 public:
  explicit CountingReader(std::unique_ptr<StepReader> inner) : inner_(std::move(inner)) {}

  Result<size_t> OpenArray(const ArraySpec& spec) override {
    Result<size_t> handle = inner_->OpenArray(spec);
    if (handle.ok()) {
      if (element_bytes_.size() <= *handle) element_bytes_.resize(*handle + 1, 0);
      element_bytes_[*handle] = DTypeSize(spec.dtype);
    }
    return handle;
  }
  Result<size_t> OpenBox(const ArraySpec& spec, int64_t file) override {
    Result<size_t> handle = inner_->OpenBox(spec, file);
    if (handle.ok()) {
      if (element_bytes_.size() <= *handle) element_bytes_.resize(*handle + 1, 0);
      element_bytes_[*handle] = DTypeSize(spec.dtype);
    }
    return handle;
  }
  Status Read(size_t array, const Box& box, void* data) override {
    Status s = inner_->Read(array, box, data);
    if (s.ok()) Count(array, box);
    return s;
  }
  Status ReadMany(std::span<const ReadRequest> requests) override {
    Status s = inner_->ReadMany(requests);
    for (size_t i = 0; s.ok() && i < requests.size(); ++i)
      Count(requests[i].array, requests[i].box);
    return s;
  }
  Status Close() override { return inner_->Close(); }

 private:
  void Count(size_t array, const Box& box) {
    if (array >= element_bytes_.size()) return;
    g_bytes_read += static_cast<uint64_t>(Volume(box.count).value_or(0)) * element_bytes_[array];
  }

  std::unique_ptr<StepReader> inner_;
  std::vector<size_t> element_bytes_;  // by handle
};

class CountingEngine final : public Engine {
 public:
  explicit CountingEngine(std::unique_ptr<Engine> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             const Comm& comm) override {
    return inner_->Create(root, step, comm);
  }
  // Both engines store a step as one data file with every array contiguous
  // at its FileOffset (storage.h), so reads by offset serve either.
  Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step, const Comm& comm,
                                           const ReadOptions& options) override {
    std::unique_ptr<StepReader> reader;
    if (!options.by_offset || options.check_metadata) {
      MHCKPT_ASSIGN_OR_RETURN(reader, inner_->Open(root, step, comm, options));
    }
    if (options.by_offset && options.files > 0) {
      reader = OpenSubfileReader(root, step, std::move(reader), options);
    } else if (options.by_offset) {
      MHCKPT_ASSIGN_OR_RETURN(
          reader, OpenPreadReader(DataPath(root, step), step, std::move(reader), options));
    }
    return std::unique_ptr<StepReader>(std::make_unique<CountingReader>(std::move(reader)));
  }

 private:
  std::unique_ptr<Engine> inner_;
};

}  // namespace

std::unique_ptr<Engine> MakeEngine(const StorageOptions& options) {
  if (options.transfer == Transfer::kIndependent && options.pwrite) {
    return std::make_unique<CountingEngine>(
        MakeDirectEngine(options.writer_threads, options.direct, options.ranks_per_file));
  }
  return std::make_unique<CountingEngine>(MakeH5Engine(options.transfer));
}

Result<size_t> StepReader::OpenBox(const ArraySpec& spec, int64_t /*file*/) {
  return Internal(
      fmt::format("array '{}': this reader reads a step's one data file, not subfiles", spec.name));
}

Status StepReader::ReadMany(std::span<const ReadRequest> requests) {
  Status checked;  // the first on_read error, returned when every read is made
  for (const ReadRequest& r : requests) {
    MHCKPT_RETURN_IF_ERROR(Read(r.array, r.box, r.data));
    if (r.on_read && checked.ok()) checked = r.on_read();
  }
  return checked;
}

uint64_t BytesRead() { return g_bytes_read.load(); }

ReadCounters Counters() {
  return {g_dataset_opens.load(), g_offset_arrays.load(), g_offset_boxes.load(),
          g_offset_reads.load(), g_direct_read_bytes.load()};
}

void CountDatasetOpen() { ++g_dataset_opens; }
void CountOffsetArray() { ++g_offset_arrays; }
void CountOffsetReads(uint64_t boxes, uint64_t reads) {
  g_offset_boxes += boxes;
  g_offset_reads += reads;
}
void CountDirectRead(uint64_t bytes) { g_direct_read_bytes += bytes; }

}  // namespace mhckpt::io
