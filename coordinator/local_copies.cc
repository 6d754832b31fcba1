#include "coordinator/local_copies.h"

#include <algorithm>

#include "io/posix_file.h"

namespace mhckpt::internal {
namespace {

class CopiesSave : public RedundancySave {
 public:
  CopiesSave(const LocalPaths& paths, io::KeptMappings& received, int64_t step, uint64_t own_bytes,
             std::vector<int> holders, std::vector<int> senders)
      : paths_(paths),
        received_(received),
        step_(step),
        own_bytes_(own_bytes),
        holders_(std::move(holders)),
        senders_(std::move(senders)) {}

  Status Map(const WriterFiles& files) {
    copies_.resize(senders_.size());
    for (size_t i = 0; i < senders_.size(); ++i) {
      MHCKPT_ASSIGN_OR_RETURN(
          copies_[i], received_.Map(paths_.FilePath(step_, senders_[i]), files.BytesOf(senders_[i]),
                                    io::KeptMappings::Mode::kCreate));
    }
    return OkStatus();
  }

  void Post(const Comm& comm, std::span<const std::byte> own,
            std::vector<MPI_Request>* requests) override {
    for (int h : holders_) {
      if (own_bytes_ > 0) comm.PostSend(own.data(), own_bytes_, h, kCopyTag, requests);
    }
    for (size_t i = 0; i < senders_.size(); ++i) {
      if (copies_[i]->size > 0) {
        comm.PostReceive(copies_[i]->data, copies_[i]->size, senders_[i], kCopyTag, requests);
      }
    }
  }

  Status Finish() override {
    // The mappings stay kept: their pages are the file's, and fsync writes
    // them back on a file system that has a disk.
    copies_.clear();
    Status s;
    for (size_t i = 0; s.ok() && i < senders_.size(); ++i) {
      s = io::FsyncFile(paths_.FilePath(step_, senders_[i]));
    }
    return s;
  }

 private:
  const LocalPaths& paths_;
  io::KeptMappings& received_;
  const int64_t step_;
  const uint64_t own_bytes_;
  const std::vector<int> holders_;  // who gets this rank's file
  const std::vector<int> senders_;  // whose files this rank gets
  std::vector<std::shared_ptr<io::KeptMappings::Mapping>> copies_;
};

}  // namespace

PartnerCopies::PartnerCopies(const Nodes& nodes, LocalPaths paths, int copies, int keep)
    : nodes_(nodes),
      paths_(std::move(paths)),
      copies_(copies),
      // A sender's file goes round the kept steps, the spare and the step
      // being written.
      received_(std::make_unique<io::KeptMappings>(static_cast<size_t>(std::max(copies, 1)) *
                                                   static_cast<size_t>(std::max(keep, 0) + 2))) {}

void PartnerCopies::AddRewritten(int rank, std::set<std::string>* names) const {
  for (int sender : nodes_.CopiesHeldBy(rank, copies_)) names->insert(WriterFileName(sender));
}

std::vector<int> PartnerCopies::Unprotected() const {
  std::vector<int> out;
  for (int r = 0; r < nodes_.ranks(); ++r) {
    if (nodes_.CopyHolders(r, copies_).empty()) out.push_back(r);
  }
  return out;
}

std::vector<int> PartnerCopies::Holders(int w) const {
  std::vector<int> with_file = nodes_.CopyHolders(w, copies_);
  with_file.push_back(w);
  return nodes_.RanksOnNodesOf(with_file);
}

Result<std::unique_ptr<RedundancySave>> PartnerCopies::BeginSave(int rank, int64_t step,
                                                                 const WriterFiles& files) const {
  auto save = std::make_unique<CopiesSave>(paths_, *received_, step, files.BytesOf(rank),
                                           nodes_.CopyHolders(rank, copies_),
                                           nodes_.CopiesHeldBy(rank, copies_));
  MHCKPT_RETURN_IF_ERROR(save->Map(files));
  return std::unique_ptr<RedundancySave>(std::move(save));
}

}  // namespace mhckpt::internal
