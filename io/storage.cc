#include "io/storage.h"

#include <atomic>
#include <utility>
#include <vector>

#include "io/direct_engine.h"
#include "io/h5_engine.h"

namespace mhckpt::io {
namespace {

std::atomic<uint64_t> g_bytes_read{0};

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
  Status Read(size_t array, const Box& box, void* data) override {
    Status s = inner_->Read(array, box, data);
    if (s.ok() && array < element_bytes_.size()) {
      g_bytes_read += static_cast<uint64_t>(Volume(box.count).value_or(0)) * element_bytes_[array];
    }
    return s;
  }
  Status Close() override { return inner_->Close(); }

 private:
  std::unique_ptr<StepReader> inner_;
  std::vector<size_t> element_bytes_;  // by handle
};

class CountingEngine final : public Engine {
 public:
  explicit CountingEngine(std::unique_ptr<Engine> inner) : inner_(std::move(inner)) {}
  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             MPI_Comm comm) override {
    return inner_->Create(root, step, comm);
  }
  Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step,
                                           MPI_Comm comm) override {
    MHCKPT_ASSIGN_OR_RETURN(std::unique_ptr<StepReader> reader, inner_->Open(root, step, comm));
    return std::unique_ptr<StepReader>(std::make_unique<CountingReader>(std::move(reader)));
  }

 private:
  std::unique_ptr<Engine> inner_;
};

}  // namespace

std::unique_ptr<Engine> MakeEngine(const StorageOptions& options) {
  if (options.transfer == Transfer::kIndependent && options.pwrite) {
    return std::make_unique<CountingEngine>(
        MakeDirectEngine(options.writer_threads, options.direct));
  }
  return std::make_unique<CountingEngine>(MakeH5Engine(options.transfer));
}

uint64_t BytesRead() { return g_bytes_read.load(); }

}  // namespace mhckpt::io
