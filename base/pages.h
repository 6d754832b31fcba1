// Faulting in pages ahead of the code that writes them.
//
// A write to a page of fresh anonymous memory costs a fault that zeroes the
// page; MADV_POPULATE_WRITE (Linux 5.14) takes those faults in one call,
// without changing what the pages hold, so that another thread can pay them
// ahead of a copy, or a pool can pay them once at build time.
#pragma once

#include <cstddef>

namespace mhckpt {

/// Faults in, for writing, the whole pages inside [data, data + bytes); the
/// bytes of a page that the range covers only in part are left alone.
/// Returns false when the kernel refuses (older than 5.14, or a mapping it
/// cannot populate): the writes then fault the pages themselves.
bool PopulateWholePages(std::byte* data, size_t bytes);

}  // namespace mhckpt
