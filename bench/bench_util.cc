#include "bench/bench_util.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace mhckpt::bench {
namespace {

// The first line of `path`, or an empty string.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The value of "Key:   1234 kB" in a /proc file, in bytes; 0 if absent.
uint64_t ProcKiB(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;
}

}  // namespace

int Rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int Size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

void Fail(const std::string& what) {
  fmt::print(stderr, "rank {}: {}\n", Rank(), what);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) Fail(fmt::format("{}: {}", what, s.ToString()));
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> MaxOverRanks(std::vector<double> v, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, comm);
  return v;
}

double MaxOverRanks(double v, MPI_Comm comm) {
  return MaxOverRanks(std::vector<double>{v}, comm)[0];
}

std::vector<double> AllGather(double v, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<double> all(static_cast<size_t>(size));
  MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm);
  return all;
}

HugePageBuffer::HugePageBuffer(size_t bytes, bool touch) : bytes_(std::max<size_t>(bytes, 1)) {
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  madvise(p, bytes_, MADV_HUGEPAGE);
  if (touch) std::memset(p, 0x5A, bytes_);
  data_ = static_cast<std::byte*>(p);
}

HugePageBuffer::~HugePageBuffer() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

ProcMemory ReadProcMemory() {
  return ProcMemory{ProcKiB("/proc/self/status", "VmRSS"), ProcKiB("/proc/self/status", "VmHWM")};
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

MachineInfo DescribeMachine() {
  MachineInfo m;
  utsname u{};
  if (uname(&u) == 0) {
    m.host = u.nodename;
    m.kernel = std::string(u.sysname) + " " + u.release + " " + u.machine;
  }
  m.cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  m.mem_total_bytes = ProcKiB("/proc/meminfo", "MemTotal");
  m.transparent_hugepages = FirstLine("/sys/kernel/mm/transparent_hugepage/enabled");
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon != std::string::npos)
      m.cpu_model = line.substr(line.find_first_not_of(' ', colon + 1));
    break;
  }
  return m;
}

std::string LoadAverage() {
  std::istringstream fields(FirstLine("/proc/loadavg"));
  std::string a, b, c;
  fields >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string UtcNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool DropCaches(const char* what) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int ok = 1;
  if (rank == 0) {
    sync();
    std::ofstream out("/proc/sys/vm/drop_caches");
    out << what;
    out.flush();
    ok = out ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok != 0;
}

}  // namespace mhckpt::bench
