#include "base/pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace mhckpt {

bool PopulateWholePages(std::byte* data, size_t bytes) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14
#endif
  static const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<uintptr_t>(data);
  const size_t head = (page - at % page) % page;
  if (bytes <= head) return true;
  const size_t whole = (bytes - head) / page * page;
  return whole == 0 || ::madvise(data + head, whole, MADV_POPULATE_WRITE) == 0;
}

}  // namespace mhckpt
