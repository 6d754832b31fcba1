// The counters behind io::Counters() (io/storage.h), for the readers in io/.
#pragma once

#include <cstdint>

namespace mhckpt::io {

void CountDatasetOpen();
void CountOffsetArray();
void CountOffsetReads(uint64_t boxes, uint64_t reads);
void CountDirectRead(uint64_t bytes);

}  // namespace mhckpt::io
