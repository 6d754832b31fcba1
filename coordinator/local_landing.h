// A rank's landing file in the local tier (coordinator/local_tier.h): the
// staging memory of its lazy saves (CopyMode::kLazy) is a file of the node's
// local dir, mapped, so that the lazy copy writes the bytes of the rank's
// file of the local step (w<R>.bin) where that file will be: save step 2
// then moves the landing file into the step directory (Take) instead of
// writing the file from staging, and the copy is the only one.
//
// The file is "landing-r<R>.bin" in the local dir (not a step directory:
// listings ignore it). Take exchanges it with the step's w<R>.bin that the
// recycled spare kept (renameat2 RENAME_EXCHANGE), so that the landing file
// is then the pages of a step dropped earlier, overwritten by the next save:
// on a tmpfs no page is allocated or faulted once the files have gone round.
// Mappings are kept per file (io/mapped_file.h), so a file mapped once is
// not mapped again when it comes back as the landing file.
//
// One save holds the landing file at a time, from Acquire (the caller's
// thread, in Save) until Take moved it into a step, or until the staging
// buffer Acquire returned is let go (the save ended without moving it, e.g.
// its plan did not put the rank's boxes back to back as staged: the local
// write then copies from the landing file as from staging). A later save's
// Acquire waits until then, as the staging pool's budget makes it wait.
//
// A crash leaves the landing file behind: it holds no step, and the next
// job's rank of that number overwrites it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/status.h"
#include "io/mapped_file.h"
#include "worker/staging_pool.h"

namespace mhckpt::internal {

class LandingFile {
 public:
  /// The landing file of rank `rank` in local dir `dir`.
  LandingFile(const std::string& dir, int rank);
  ~LandingFile();
  LandingFile(const LandingFile&) = delete;
  LandingFile& operator=(const LandingFile&) = delete;

  /// Caller's thread: waits until no save holds the landing file (the time
  /// waited into `waited_seconds`), then sizes it to `bytes` (reserved in
  /// full: a full tmpfs is IoError here, not SIGBUS in the copy) and returns
  /// its mapping as a staging buffer, which lets the file go when destroyed
  /// (unless Take moved it).
  Result<StagingBuffer> Acquire(size_t bytes, double* waited_seconds);

  /// Acquire without waiting: nullopt (nothing held) if a save holds the
  /// landing file. With `warm_only` (the caller's thread in a blocking save,
  /// which must not pay for new file pages) also nullopt unless its mapping
  /// of `bytes` is kept from an earlier save. Without it (the I/O thread,
  /// writing a step's file, which must not wait for a later save's hold)
  /// also nullopt if the file cannot be sized or mapped.
  std::optional<StagingBuffer> TryAcquire(size_t bytes, bool warm_only);

  /// I/O thread, save step 2: if [data, data + bytes) is the whole mapping
  /// of the held landing file, moves that file to `path` (exchanged with
  /// the file there, if any, which becomes the landing file) and lets the
  /// next save acquire. False (nothing moved) otherwise, or if the file
  /// system cannot exchange names. The mapping stays valid for the buffer
  /// that Acquire returned.
  bool Take(const std::byte* data, uint64_t bytes, const std::string& path);

  [[nodiscard]] const std::string& path() const { return path_; }

  /// The kept mapping of the file at `path`, `bytes` long (a landing file
  /// moved into a step, read back by the shared root's write), or nullptr.
  std::shared_ptr<io::KeptMappings::Mapping> Kept(const std::string& path, uint64_t bytes) {
    auto m = maps_.Map(path, bytes, io::KeptMappings::Mode::kWarmOnly);
    return m.ok() ? std::move(m).value() : nullptr;
  }

  /// Lets go of the kept mappings of deleted files (after a retention).
  void ForgetDeleted() { maps_.ForgetDeleted(); }

 private:
  struct Lease;
  void Release(uint64_t token);
  /// Acquire's work once the file is held (`token`). With `warm_only`, a
  /// file without a kept mapping of `bytes` is let go: NotFound.
  Result<StagingBuffer> MapHeld(uint64_t token, size_t bytes, bool warm_only);

  const std::string dir_;
  const std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  uint64_t token_ = 0;                                   // the holder's
  std::shared_ptr<io::KeptMappings::Mapping> held_map_;  // the holder's mapping
  io::KeptMappings maps_;
};

}  // namespace mhckpt::internal
