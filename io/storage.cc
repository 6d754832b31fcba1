#include "io/storage.h"

#include "io/direct_engine.h"
#include "io/h5_engine.h"

namespace mhckpt::io {

std::unique_ptr<Engine> MakeEngine(const StorageOptions& options) {
  if (options.transfer == Transfer::kIndependent && options.pwrite) {
    return MakeDirectEngine(options.writer_threads, options.direct);
  }
  return MakeH5Engine(options.transfer);
}

}  // namespace mhckpt::io
