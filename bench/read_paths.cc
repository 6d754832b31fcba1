// mhckpt-read-paths: one cold read of a whole file into new memory, the ways a
// restore could read it (docs/PERFORMANCE.md, "Measurements behind the defaults"). No MPI, no
// library: the machine's own figures for the choice behind RestoreOptions::direct_reads.
//
//   mhckpt-read-paths FILE MODE THREADS [base]
//
// MODE: direct (O_DIRECT 8 MiB preads straight into the destination), bounce
// (O_DIRECT into a per-thread buffer, then memcpy), buffered (16 MiB preads
// through the page cache). The destination is a fresh anonymous mapping,
// advised MADV_HUGEPAGE as numpy advises its arrays unless `base`. Prints the
// seconds and GB/s. Drop the page cache before each run (as root):
//
//   F=/var/tmp/x/mhckpt-bench-sharded/step_0000000001/data.h5
//   for m in "direct 1" "direct 4" "direct 8" "bounce 2"; do
//     sync; echo 1 >/proc/sys/vm/drop_caches; build/bin/mhckpt-read-paths $F $m
//   done
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace {

constexpr size_t kAlign = 4096;

[[noreturn]] void Die(const std::string& what) {
  fmt::print(stderr, "mhckpt-read-paths: {}: {}\n", what, std::strerror(errno));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fmt::print(stderr, "usage: {} FILE direct|bounce|buffered THREADS [base]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1], mode = argv[2];
  const int threads = std::max(1, std::atoi(argv[3]));
  const bool huge = argc < 5 || std::string(argv[4]) != "base";
  const bool direct = mode != "buffered";
  const int fd = ::open(path.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
  if (fd < 0) Die("open " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) Die("fstat");
  const auto size = static_cast<size_t>(st.st_size);
  const size_t chunk = direct ? size_t{8} << 20 : size_t{16} << 20;
  void* map =
      ::mmap(nullptr, size + chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) Die("mmap");
  auto* dst = static_cast<std::byte*>(map);
  if (huge) (void)::madvise(dst, size, MADV_HUGEPAGE);
  if (!direct) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);

  std::atomic<size_t> next{0};
  auto work = [&] {
    std::byte* bounce = nullptr;
    if (mode == "bounce") bounce = static_cast<std::byte*>(std::aligned_alloc(kAlign, chunk));
    for (size_t off; (off = next.fetch_add(chunk)) < size;) {
      const size_t n = std::min(chunk, size - off);
      const size_t ask = direct ? (n + kAlign - 1) / kAlign * kAlign : n;  // the tail, rounded up
      std::byte* to = bounce != nullptr ? bounce : dst + off;
      if (::pread(fd, to, ask, static_cast<off_t>(off)) < static_cast<ssize_t>(n)) Die("pread");
      if (bounce != nullptr) std::memcpy(dst + off, bounce, n);
    }
    std::free(bounce);
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{} {} thread(s), {} pages: {:.3f} s, {:.2f} GB/s\n", mode, threads,
             huge ? "huge" : "base", s, static_cast<double>(size) / s / 1e9);
  ::close(fd);
  return 0;
}
