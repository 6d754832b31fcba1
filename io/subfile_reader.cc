#include "io/subfile_reader.h"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/layout.h"
#include "io/pread_reader.h"

namespace mhckpt::io {
namespace {

class SubfileReader final : public StepReader {
 public:
  SubfileReader(std::string root, int64_t step, std::unique_ptr<StepReader> metadata,
                const ReadOptions& options)
      : root_(std::move(root)),
        step_(step),
        metadata_(std::move(metadata)),
        options_(options),
        readers_(static_cast<size_t>(options.files)) {}

  // An array's bytes are read box by box (OpenBox); its handle reads nothing.
  Result<size_t> OpenArray(const ArraySpec& spec) override {
    if (metadata_) MHCKPT_RETURN_IF_ERROR(metadata_->OpenArray(spec).status());
    handles_.push_back({-1, 0, spec.name});
    return handles_.size() - 1;
  }

  Result<size_t> OpenBox(const ArraySpec& spec, int64_t file) override {
    if (file < 0 || static_cast<size_t>(file) >= readers_.size()) {
      return DataLoss(fmt::format("step {}: array '{}' is placed in subfile {} of {}", step_,
                                  spec.name, file, readers_.size()));
    }
    std::unique_ptr<StepReader>& reader = readers_[static_cast<size_t>(file)];
    if (!reader) {
      MHCKPT_ASSIGN_OR_RETURN(
          reader, OpenPreadReader(SubfilePath(root_, step_, file), step_, nullptr, options_));
    }
    MHCKPT_ASSIGN_OR_RETURN(size_t inner, reader->OpenArray(spec));
    handles_.push_back({file, inner, spec.name});
    return handles_.size() - 1;
  }

  Status Read(size_t array, const Box& box, void* data) override {
    MHCKPT_ASSIGN_OR_RETURN(Handle h, Find(array));
    return readers_[static_cast<size_t>(h.file)]->Read(h.inner, box, data);
  }

  Status ReadMany(std::span<const ReadRequest> requests) override {
    std::vector<std::vector<ReadRequest>> by_file(readers_.size());
    for (const ReadRequest& r : requests) {
      MHCKPT_ASSIGN_OR_RETURN(Handle h, Find(r.array));
      by_file[static_cast<size_t>(h.file)].push_back({h.inner, r.box, r.data, r.on_read});
    }
    for (size_t f = 0; f < by_file.size(); ++f) {
      if (!by_file[f].empty()) MHCKPT_RETURN_IF_ERROR(readers_[f]->ReadMany(by_file[f]));
    }
    return OkStatus();
  }

  Status Close() override {
    Status s;
    for (std::unique_ptr<StepReader>& r : readers_) {
      if (!r) continue;
      Status closed = r->Close();
      if (s.ok()) s = closed;
    }
    if (metadata_) {
      Status closed = metadata_->Close();
      if (s.ok()) s = closed;
    }
    return s;
  }

 private:
  struct Handle {
    int64_t file = -1;  // -1: an array opened with OpenArray
    size_t inner = 0;   // the subfile reader's handle
    std::string name;
  };

  Result<Handle> Find(size_t handle) const {
    if (handle >= handles_.size())
      return Internal(fmt::format("step {}: no handle {}", step_, handle));
    const Handle& h = handles_[handle];
    if (h.file < 0) {
      return Internal(
          fmt::format("step {}: array '{}' of a step with subfiles read as a whole, not box by box",
                      step_, h.name));
    }
    return h;
  }

  std::string root_;
  int64_t step_;
  std::unique_ptr<StepReader> metadata_;
  ReadOptions options_;
  std::vector<std::unique_ptr<StepReader>> readers_;  // by subfile, opened on first use
  std::vector<Handle> handles_;
};

}  // namespace

std::unique_ptr<StepReader> OpenSubfileReader(const std::string& root, int64_t step,
                                              std::unique_ptr<StepReader> metadata,
                                              const ReadOptions& options) {
  return std::make_unique<SubfileReader>(root, step, std::move(metadata), options);
}

}  // namespace mhckpt::io
