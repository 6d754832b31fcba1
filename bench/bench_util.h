// Small helpers for the benchmarks: clocks, medians, reductions over ranks,
// the process's memory from /proc, and a description of the machine.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace mhckpt::bench {

using Clock = std::chrono::steady_clock;

/// This process's rank in MPI_COMM_WORLD, and the world's size.
int Rank();
int Size();

/// Prints "rank R: what" to stderr and aborts the job (MPI_Abort).
[[noreturn]] void Fail(const std::string& what);
/// Fail("what: status") unless `s` is OK.
void Check(const Status& s, const char* what);

/// Seconds since `t0`.
double Since(Clock::time_point t0);

/// The median of `v` (the mean of the middle two for an even count); 0 if empty.
double Median(std::vector<double> v);

/// Collective: the element-wise maximum of `v` over the ranks of `comm` (every
/// rank passes the same length).
std::vector<double> MaxOverRanks(std::vector<double> v, MPI_Comm comm = MPI_COMM_WORLD);
double MaxOverRanks(double v, MPI_Comm comm = MPI_COMM_WORLD);

/// Collective: every rank's `v`, in rank order, on every rank.
std::vector<double> AllGather(double v, MPI_Comm comm = MPI_COMM_WORLD);

/// Anonymous memory asking for transparent huge pages (MADV_HUGEPAGE), as the
/// staging pool maps its buffers and numpy its large arrays; every page
/// touched once, unless `touch` is false (fresh memory: the first write to
/// each page faults). Unmapped on destruction. data() is null if the
/// mapping failed.
class HugePageBuffer {
 public:
  explicit HugePageBuffer(size_t bytes, bool touch = true);
  ~HugePageBuffer();
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  [[nodiscard]] std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

/// Resident memory of this process, from /proc/self/status.
struct ProcMemory {
  uint64_t rss_bytes = 0;  ///< VmRSS
  uint64_t hwm_bytes = 0;  ///< VmHWM: the peak of VmRSS since start or the last reset
};
ProcMemory ReadProcMemory();

/// CPU time of this process so far, every thread (CLOCK_PROCESS_CPUTIME_ID).
/// Against the wall time of a step it tells work from waiting.
double ProcessCpuSeconds();

/// Minor page faults of this process so far (every thread), from getrusage:
/// a copy into fresh memory faults once per page, into touched memory never.
double MinorFaults();

/// Resets VmHWM to the current VmRSS (writes "5" to /proc/self/clear_refs,
/// Linux 4.0+). False if the kernel refused.
bool ResetPeakRss();

/// Where the numbers came from: host name, cores, memory, kernel, THP mode.
struct MachineInfo {
  std::string host;
  std::string kernel;
  std::string cpu_model;
  int cores = 0;
  uint64_t mem_total_bytes = 0;
  std::string transparent_hugepages;  ///< e.g. "always [madvise] never"
};
MachineInfo DescribeMachine();

/// The first three fields of /proc/loadavg ("0.12 0.30 0.25"): other work on
/// the machine makes every figure noisier, so runs record it.
std::string LoadAverage();

/// The current UTC time as "2024-05-01T12:00:00Z".
std::string UtcNow();

/// Collective over MPI_COMM_WORLD: rank 0 syncs and writes `what` to
/// /proc/sys/vm/drop_caches ("1": the page cache; "3": dentries and inodes
/// too). False on every rank if the kernel refused (not root).
bool DropCaches(const char* what = "1");

/// Bytes as MiB, for tables.
inline double MiB(double bytes) { return bytes / (1024.0 * 1024.0); }
/// Bytes per second as GiB/s.
inline double GiBps(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / (1024.0 * 1024.0 * 1024.0) : 0;
}

}  // namespace mhckpt::bench
