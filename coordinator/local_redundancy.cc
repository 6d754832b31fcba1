#include "coordinator/local_redundancy.h"

#include "coordinator/local_copies.h"
#include "coordinator/local_parity.h"

namespace mhckpt::internal {

std::unique_ptr<LocalRedundancy> MakeLocalRedundancy(const Options& options, const Nodes& nodes,
                                                     const LocalPaths& paths) {
  if (options.local_parity_group > 0) {
    return std::make_unique<XorParity>(nodes, paths, options.local_parity_group);
  }
  return std::make_unique<PartnerCopies>(nodes, paths, options.local_copies,
                                         options.local_max_to_keep);
}

}  // namespace mhckpt::internal
