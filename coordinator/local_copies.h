// Partner copies (coordinator/local_redundancy.h): each rank's writer file
// goes whole to its copy holders (Nodes::CopyHolders: the rank at its
// position on each of the next `copies` nodes of the ring), and each rank
// receives the files of the ranks it holds copies for straight into their
// mappings. A file survives while any of those nodes does.
#pragma once

#include "coordinator/local_redundancy.h"

namespace mhckpt::internal {

class PartnerCopies : public LocalRedundancy {
 public:
  PartnerCopies(const Nodes& nodes, LocalPaths paths, int copies)
      : nodes_(nodes), paths_(std::move(paths)), copies_(copies) {}

  void AddRewritten(int rank, std::set<std::string>* names) const override;
  [[nodiscard]] std::vector<int> Unprotected() const override;
  [[nodiscard]] std::vector<int> Holders(int w) const override;
  [[nodiscard]] std::vector<std::vector<int>> Groups() const override { return {}; }
  Result<std::unique_ptr<RedundancySave>> BeginSave(int rank, int64_t step,
                                                    const WriterFiles& files) const override;

 private:
  const Nodes& nodes_;
  const LocalPaths paths_;
  const int copies_;
};

}  // namespace mhckpt::internal
