#include "io/direct_engine.h"

#include <optional>
#include <utility>

#include "io/direct_writer.h"
#include "io/h5_engine.h"
#include "io/raw_writer.h"
#include "io/subfile_writer.h"

namespace mhckpt::io {
namespace {

class DirectEngine final : public Engine {
 public:
  DirectEngine(int threads, bool direct, int ranks_per_file)
      : pool_(threads),
        direct_(direct),
        ranks_per_file_(ranks_per_file),
        reader_(MakeH5Engine(Transfer::kIndependent)) {}

  Result<std::unique_ptr<StepWriter>> Create(const std::string& root, int64_t step,
                                             const Comm& comm) override {
    if (ranks_per_file_ == 0) {
      return CreateDirectStepWriter(root, step, comm, {&pool_, direct_, &skeleton_});
    }
    if (!groups_ || groups_->comm_id != comm.id()) {
      groups_ = MakeSubfileGroups(comm, ranks_per_file_);
      skeleton_.Clear();  // laid out for other groups
      data_skeleton_.Clear();
    }
    return CreateSubfileStepWriter(root, step, comm,
                                   {&pool_, direct_, &*groups_, &skeleton_, &data_skeleton_});
  }

  Result<std::unique_ptr<StepReader>> Open(const std::string& root, int64_t step, const Comm& comm,
                                           const ReadOptions& options) override {
    return reader_->Open(root, step, comm, options);
  }

 private:
  RawWriterPool pool_;
  bool direct_;
  int ranks_per_file_;
  std::optional<SubfileGroups> groups_;  // with subfiles, from the first Create on
  std::unique_ptr<Engine> reader_;
  LayoutSkeleton skeleton_;       // rank 0's last data.h5 (with subfiles: its group's subfile)
  LayoutSkeleton data_skeleton_;  // with subfiles, rank 0's last data.h5
};

}  // namespace

std::unique_ptr<Engine> MakeDirectEngine(int threads, bool direct, int ranks_per_file) {
  return std::make_unique<DirectEngine>(threads, direct, ranks_per_file);
}

}  // namespace mhckpt::io
