// Partner copies (coordinator/local_redundancy.h): each rank's writer file
// goes whole to its copy holders (Nodes::CopyHolders: the rank at its
// position on each of the next `copies` nodes of the ring), and each rank
// receives the files of the ranks it holds copies for straight into their
// mappings, kept from save to save (io/mapped_file.h): the files of a
// recycled step directory come back, and are not mapped again. A file
// survives while any of those nodes does.
#pragma once

#include "coordinator/local_redundancy.h"
#include "io/mapped_file.h"

namespace mhckpt::internal {

class PartnerCopies : public LocalRedundancy {
 public:
  /// `copies` copies of each file; `keep`: the steps the local tier keeps.
  PartnerCopies(const Nodes& nodes, LocalPaths paths, int copies, int keep);

  void AddRewritten(int rank, std::set<std::string>* names) const override;
  [[nodiscard]] std::vector<int> Unprotected() const override;
  [[nodiscard]] std::vector<int> Holders(int w) const override;
  [[nodiscard]] std::vector<std::vector<int>> Groups() const override { return {}; }
  Result<std::unique_ptr<RedundancySave>> BeginSave(int rank, int64_t step,
                                                    const WriterFiles& files) const override;
  void ForgetDeleted() override { received_->ForgetDeleted(); }

 private:
  const Nodes& nodes_;
  const LocalPaths paths_;
  const int copies_;
  // The mappings of the files this rank receives (the I/O thread's).
  std::unique_ptr<io::KeptMappings> received_;
};

}  // namespace mhckpt::internal
