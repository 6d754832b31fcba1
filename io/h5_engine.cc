#include "io/h5_engine.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/h5_file.h"
#include "io/layout.h"
#include "io/posix_file.h"
#include "io/read_counters.h"

namespace mhckpt::io {
namespace {

class H5StepWriter final : public StepWriter {
 public:
  H5StepWriter(H5File file, std::string path) : file_(std::move(file)), path_(std::move(path)) {}

  Status CreateArrays(std::span<const ArraySpec> arrays) override {
    datasets_.reserve(arrays.size());
    for (const ArraySpec& a : arrays) {
      MHCKPT_ASSIGN_OR_RETURN(Dataset ds, file_.CreateDataset(a.name, a.dtype, a.shape));
      datasets_.push_back(std::move(ds));
    }
    return OkStatus();
  }

  Status Reserve() override {
    uint64_t end = 0;
    for (const Dataset& d : datasets_) end = std::max(end, d.EndInFile());
    // Exactly the data: the file is at least this long when HDF5 closes it
    // (its end of allocation lies past every dataset), so nothing is to be
    // trimmed afterwards.
    return Preallocate(path_, end);
  }

  [[nodiscard]] int64_t FileOffset(size_t array) const override {
    std::optional<uint64_t> offset = datasets_[array].OffsetInFile();
    return offset ? static_cast<int64_t>(*offset) : -1;
  }

  Status Write(size_t array, const Box& box, const void* data) override {
    return datasets_[array].Write(box, data);
  }

  Status WriteNothing(size_t array) override { return datasets_[array].WriteNothing(); }

  Status FinishWrites() override { return OkStatus(); }  // H5Dwrite has returned

  Status Flush() override {
    datasets_.clear();  // every dataset is closed before the file
    return file_.FlushAndClose();
  }

 private:
  H5File file_;
  std::string path_;
  std::vector<Dataset> datasets_;
};

class H5StepReader final : public StepReader {
 public:
  H5StepReader(H5File file, int64_t step) : file_(std::move(file)), step_(step) {}

  Result<size_t> OpenArray(const ArraySpec& spec) override {
    MHCKPT_ASSIGN_OR_RETURN(Dataset ds, file_.OpenDataset(spec.name, spec.dtype, spec.shape));
    CountDatasetOpen();
    // A recorded offset is where reads by offset look (pread_reader.h): it
    // must be where the dataset's bytes are.
    const std::optional<uint64_t> at = ds.OffsetInFile();
    if (spec.offset >= 0 && (!at || *at != static_cast<uint64_t>(spec.offset))) {
      return DataLoss(fmt::format("array '{}': stored at byte {}, the marker says {}", spec.name,
                                  at ? static_cast<int64_t>(*at) : -1, spec.offset));
    }
    datasets_.push_back(std::move(ds));
    names_.push_back(spec.name);
    return datasets_.size() - 1;
  }

  Status Read(size_t array, const Box& box, void* data) override {
    Status s = datasets_[array].Read(box, data);
    if (s.ok()) return s;
    return {s.code(), fmt::format("step {}: array '{}' box {}: {}", step_, names_[array],
                                  BoxToString(box), s.message())};
  }

  Status Close() override {
    datasets_.clear();  // every dataset is closed before the file
    return file_.Close();
  }

 private:
  H5File file_;
  int64_t step_;
  std::vector<Dataset> datasets_;
  std::vector<std::string> names_;  // of datasets_, for messages
};

class H5Engine final : public Engine {
 public:
  explicit H5Engine(Transfer transfer) : transfer_(transfer) {}

  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             const Comm& comm) override {
    std::string path = DataPath(root, step);
    MHCKPT_ASSIGN_OR_RETURN(H5File file, H5File::Create(path, comm, transfer_));
    return std::unique_ptr<StepWriter>(new H5StepWriter(std::move(file), std::move(path)));
  }

  Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step, const Comm& comm,
                                           const ReadOptions& /*options*/) override {
    MHCKPT_ASSIGN_OR_RETURN(
        H5File file, H5File::OpenReadOnly(DataPath(root, step), comm, Transfer::kIndependent));
    return std::unique_ptr<StepReader>(new H5StepReader(std::move(file), step));
  }

 private:
  Transfer transfer_;
};

}  // namespace

std::unique_ptr<Engine> MakeH5Engine(Transfer transfer) {
  return std::make_unique<H5Engine>(transfer);
}

}  // namespace mhckpt::io
