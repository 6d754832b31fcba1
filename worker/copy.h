// Copies between caller buffers and staging memory: host memory with several
// threads, device memory through CUDA (worker/cuda_copy.cc, when built with
// the CUDA toolkit).
#pragma once

#include <atomic>
#include <cstddef>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"
#include "worker/array.h"

namespace mhckpt::internal {

struct CopyTask {
  void* dst;
  const void* src;
  size_t bytes;
  /// Device copies: the device of the device-side pointer (-1: ask CUDA) and
  /// the caller's cudaStream_t the copy is ordered with (nullptr: legacy
  /// default stream). Unused by host copies.
  int device = -1;
  void* stream = nullptr;
};

/// Below this many bytes per thread, a copy thread costs more than it saves.
inline constexpr size_t kMinBytesPerCopyThread = size_t{16} << 20;

/// Copies host memory with up to `threads` threads, splitting the total bytes
/// evenly (a single large copy is split too). Small totals use one thread.
void ParallelCopy(std::span<const CopyTask> tasks, int threads);
/// ParallelCopy with GuardedCopy (worker/fault_guard.h): a source that
/// faults (freed under the copy) ends its piece instead of the process.
/// Returns the index of the first task that faulted, or nullopt.
std::optional<size_t> ParallelGuardedCopy(std::span<const CopyTask> tasks, int threads);

/// Copies `bytes` from `src` to `dst` with stores that bypass the cache
/// (x86-64's streaming stores; memcpy elsewhere), the stores complete on
/// return. For a copy taken in pieces that are read again at once: the
/// source stays in cache for the next pass over it (a checksum), where
/// memcpy's ordinary stores of a small piece would first read the
/// destination in and push the source out.
void CopyUncached(void* dst, const void* src, size_t bytes);

/// Faults in the pages of host ranges for writing on a thread of its own
/// (MADV_POPULATE_WRITE, Linux 5.14), in order, a few MiB at a time, so that
/// the kernel's work on fresh memory (a fault and a cleared page per page)
/// runs beside a copy into the ranges instead of inside it. The contents
/// are left as they are. Any refusal (an older kernel, memory that cannot be
/// populated) or no thread to be had ends it: the copy then faults the pages
/// itself. Stops at the next piece and joins on destruction.
class PrefaultThread {
 public:
  explicit PrefaultThread(std::vector<std::pair<std::byte*, size_t>> ranges);
  ~PrefaultThread();
  PrefaultThread(const PrefaultThread&) = delete;
  PrefaultThread& operator=(const PrefaultThread&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// True if a CUDA device can be used. False when built without CUDA, or with
/// no driver or device (cudaGetDeviceCount fails with error 35 on a machine
/// that has the toolkit but no driver).
bool CudaAvailable();

/// Copies device memory to (pinned) host memory with cudaMemcpyAsync on
/// streams of its own (a few per device, made once and reused; copies on
/// several devices overlap). Each copy starts only after the work issued so
/// far on its task's caller stream (an event recorded there, waited on by
/// ours). Returns after every copy has completed, also on an error (every
/// stream of ours is synchronised first), with the calling thread's current
/// context unchanged.
Status CopyDeviceToHost(std::span<const CopyTask> tasks);

/// Copies host memory to device memory the same way, in both directions of
/// order: the copies start after the work issued so far on each task's
/// caller stream (they may overwrite what that work still reads or writes
/// otherwise), and each caller stream is made to wait for the copies.
/// Returns after every copy completed.
Status CopyHostToDevice(std::span<const CopyTask> tasks);

/// A lazy save's device copies, ordered at Save time and issued later.
/// MarkCallerStreams runs on the caller's thread when Save is called: it
/// resolves each task's device (CopyTask::device) and records an event of
/// its own on each distinct caller stream of each device, so that the mark
/// stands for the work issued there so far (a per-thread default stream is
/// the calling thread's, which is why this cannot wait for another thread).
/// CopyDeviceToHostAfter, on any thread and later, queues the copies on
/// mhckpt's streams behind those events instead of recording new ones, so
/// that work the caller issued after the mark is not waited for, and
/// returns once every copy has completed (as CopyDeviceToHost). The events
/// are destroyed with the mark. Move-only.
class CallerStreamMark {
 public:
  CallerStreamMark() = default;
  ~CallerStreamMark();
  CallerStreamMark(CallerStreamMark&& other) noexcept;
  CallerStreamMark& operator=(CallerStreamMark&& other) noexcept;
  CallerStreamMark(const CallerStreamMark&) = delete;
  CallerStreamMark& operator=(const CallerStreamMark&) = delete;

  /// One caller stream on one device, and the event recorded on it.
  struct Entry {
    int device = -1;
    void* stream = nullptr;  // cudaStream_t
    void* event = nullptr;   // cudaEvent_t
  };
  [[nodiscard]] const std::vector<Entry>& entries() const { return entries_; }
  /// Destroys the events (each in its device's context).
  void Reset();

 private:
  friend Status MarkCallerStreams(std::span<CopyTask>, CallerStreamMark*, std::optional<size_t>*);
  std::vector<Entry> entries_;
};

/// See CallerStreamMark. Tasks with no bytes are skipped; their `dst` is not
/// read. On an error, `failed` (if given) is set to the index of the task
/// the error is about, when one is.
Status MarkCallerStreams(std::span<CopyTask> tasks, CallerStreamMark* mark,
                         std::optional<size_t>* failed);
/// See CallerStreamMark: `tasks` as given to MarkCallerStreams (devices
/// resolved), with their destinations. On an error, `failed` (if given) is
/// set to the index of the task the error is about: the copy that CUDA
/// refused, or for an error seen only when the copies were waited for, the
/// first copy on the stream that reported it.
Status CopyDeviceToHostAfter(std::span<const CopyTask> tasks, const CallerStreamMark& mark,
                             std::optional<size_t>* failed);

/// Restore's device destinations are given on the caller's thread, but
/// copied to on the I/O thread, where cudaStreamPerThread names that
/// thread's own stream, not the caller's: the copies would be ordered with
/// neither the caller's earlier work nor its later work. StreamProxies,
/// used on the caller's thread, stands a stream of mhckpt's own (one per
/// device, non-blocking) in for each such stream. Resolve, at the API call,
/// makes the proxy wait on an event recorded on the caller's per-thread
/// stream, so that the proxy carries the caller's order to any thread, and
/// names it in the destinations the I/O thread gets. Finish, once the
/// restore has returned, makes the caller's stream wait for an event
/// recorded on the proxy (the copies ended before the restore returned;
/// this also orders anything the I/O thread queued on the proxy). Every
/// other stream (a stream of the caller's, the legacy default stream)
/// names the same stream on every thread and is left as it is.
class StreamProxies {
 public:
  StreamProxies() = default;
  ~StreamProxies();  ///< Finish, if it was not called
  StreamProxies(const StreamProxies&) = delete;
  StreamProxies& operator=(const StreamProxies&) = delete;

  /// `arrays` itself if none of its device destinations names
  /// cudaStreamPerThread; else a copy in `*storage` with those streams
  /// replaced by proxies (and their devices resolved). Never fails, so that
  /// a rank does not leave the restore's collectives: where a proxy cannot
  /// be made, the caller's per-thread stream is synchronised here instead
  /// (its earlier work is then done) and the destination names the legacy
  /// default stream, logged once.
  std::span<const ArrayToRestore> Resolve(std::span<const ArrayToRestore> arrays,
                                          std::vector<ArrayToRestore>* storage);
  /// Each proxied caller stream waits for its proxy; the proxies go.
  void Finish();

 private:
  struct Proxy {
    int device = -1;
    void* stream = nullptr;  // cudaStream_t, ours
    void* event = nullptr;   // cudaEvent_t
  };
  std::vector<Proxy> proxies_;
};

/// Tests only: false makes StreamProxies::Resolve leave cudaStreamPerThread
/// as it is (the I/O thread then orders the copies with its own stream: the
/// bug the per-thread stream tests must catch).
void SetResolveCallerStreamsForTest(bool resolve);

/// Tests only: false makes the copies above start at once, without waiting
/// for the caller streams (the bug the ordering tests must catch);
/// MarkCallerStreams then records no event.
void SetWaitForCallerStreamsForTest(bool wait);

/// Makes a CUDA device current on the calling thread for a scope, and puts
/// back the thread's previous context (none, if it had none) at its end: an
/// I/O or snapshot thread never creates a context on a device mhckpt was not
/// asked to use, and a caller's thread keeps its own. Without CUDA, a no-op.
class ScopedDevice {
 public:
  ScopedDevice();
  ~ScopedDevice();  // NOLINT(performance-trivially-destructible): not trivial with CUDA
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  /// Makes `device` current (its primary context); IoError if CUDA refuses.
  Status Use(int device);
  /// Whether the thread had a current context when the scope began.
  [[nodiscard]] bool had_context() const { return saved_context_ != nullptr; }

 private:
  void* saved_context_ = nullptr;  // CUcontext
  int saved_device_ = -1;          // when the driver's context calls are unavailable
  bool changed_ = false;
};

/// Remembers `device` as one mhckpt was asked to use: threads without a
/// context pin host memory on it. Resolves -1 from `data` (device memory).
void NoteDevice(int device, const void* data);

/// Host memory that CUDA can copy from and to at full speed (cudaMallocHost;
/// plain memory without CUDA). For restore's landing of device destinations.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  /// `device`: the device the buffer is copied to or from (-1: the thread's
  /// current context, else a device noted before); its context allocates.
  explicit PinnedBuffer(size_t bytes, int device = -1);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] size_t size() const { return size_; }
  /// Whether cudaHostAlloc gave the memory (else it is plain, pageable).
  [[nodiscard]] bool pinned() const { return pinned_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
  int device_ = -1;  // the device whose context allocated it (-1: the thread's)
};

/// The CUDA device that holds `data` (device or managed memory);
/// InvalidArgument for host memory, FailedPrecondition without CUDA.
Result<int> DeviceOfPointer(const void* data);

/// Pins (page-locks) host memory for fast DMA, in the thread's current
/// context or on a device noted before; returns whether it did (false
/// without CUDA). A failure (or no device known yet) leaves the memory
/// pageable, copies slower, and is logged once per process; the staging
/// pool tries again at the buffer's next use.
bool PinHostMemory(void* data, size_t bytes);
void UnpinHostMemory(void* data);

}  // namespace mhckpt::internal
