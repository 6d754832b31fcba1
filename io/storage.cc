#include "io/storage.h"

#include "io/h5_engine.h"

namespace mhckpt::io {

std::unique_ptr<Engine> MakeEngine(const StorageOptions& options) {
  return MakeH5Engine(options.transfer);
}

}  // namespace mhckpt::io
