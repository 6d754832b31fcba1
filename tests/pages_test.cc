// PopulateWholePages: the whole pages of a range are faulted in, their bytes
// and those of the pages cut at either end stay as they were.
#include "base/pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>

namespace mhckpt {
namespace {

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
    if (data_ != nullptr) madvise(data_, bytes, MADV_NOHUGEPAGE);  // one fault per base page
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_;
};

TEST(PopulateWholePages, FaultsInTheWholePagesAndChangesNoByte) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  constexpr size_t kPages = 64;
  Mapping m(kPages * page);
  ASSERT_NE(m.data(), nullptr);
  // A byte written on the first and the last page: the range below cuts both.
  m.data()[page - 1] = std::byte{0x5a};
  m.data()[(kPages - 1) * page] = std::byte{0xa5};
  const long before = MinorFaults();
  if (!PopulateWholePages(m.data() + page - 1, (kPages - 2) * page + 2)) {
    GTEST_SKIP() << "MADV_POPULATE_WRITE refused (a kernel before 5.14)";
  }
  const long populated = MinorFaults() - before;
  // The 62 whole pages in between are faulted in: writing them faults no more.
  const long again = MinorFaults();
  for (size_t i = 1; i + 1 < kPages; ++i) m.data()[i * page + 7] = std::byte{1};
  EXPECT_EQ(MinorFaults() - again, 0) << populated << " faults taken by the populate";
  EXPECT_EQ(m.data()[page - 1], std::byte{0x5a});
  EXPECT_EQ(m.data()[(kPages - 1) * page], std::byte{0xa5});
  for (size_t i = 1; i + 1 < kPages; ++i) EXPECT_EQ(m.data()[i * page], std::byte{0}) << i;
}

TEST(PopulateWholePages, ARangeInsideOnePageIsLeftAlone) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Mapping m(2 * page);
  ASSERT_NE(m.data(), nullptr);
  EXPECT_TRUE(PopulateWholePages(m.data() + 1, page - 2));
  EXPECT_TRUE(PopulateWholePages(m.data() + page - 3, 6));  // across a boundary, no whole page
  EXPECT_TRUE(PopulateWholePages(m.data(), 0));
}

}  // namespace
}  // namespace mhckpt
