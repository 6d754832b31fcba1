// Version-1 checkpoints (commit markers without chunk checksums or offsets)
// still restore and verify: tests/fixtures/v1 holds one, written at 2 ranks
// by tests/known_values_save.cc before format version 2. Run at 1-3 ranks:
// the same sharding as the save (whole stored boxes, checked) and others
// (parts of stored boxes, which version 1 cannot check).
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::FreshDir;
using ::testing::HasSubstr;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

constexpr int64_t kStep = 41;

class FormatV1 : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    if (Rank() == 0) {
      std::filesystem::copy(std::string(MHCKPT_V1_FIXTURE) + "/step_0000000041",
                            io::StepDir(dir_, kStep));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    mgr_ = OpenForTest(dir_);
    ASSERT_TRUE(mgr_);
  }

  // Restores the whole of array `name` on every rank.
  Result<std::vector<std::byte>> Whole(const std::string& name) {
    Result<StepDescription> d = mgr_->Describe(kStep);
    if (!d.ok()) return d.status();
    const StoredArray* a = d->Find(name);
    std::vector<std::byte> out(static_cast<size_t>(*Volume(a->shape)) * DTypeSize(a->dtype));
    ArrayToRestore r{name, a->dtype, {{FullBox(a->shape), out.data()}}};
    MHCKPT_RETURN_IF_ERROR(mgr_->Restore(kStep, std::vector<ArrayToRestore>{r}));
    return out;
  }

  std::string dir_;
  std::unique_ptr<CheckpointManager> mgr_;
};

template <typename T>
std::vector<T> As(const std::vector<std::byte>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

TEST_F(FormatV1, DescribesVerifiesAndRestoresTheKnownValues) {
  Result<StepDescription> d = mgr_->Describe(kStep);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->format_version, 1);
  EXPECT_EQ(d->world_size, 2);
  Status v = mgr_->Verify(kStep);
  EXPECT_TRUE(v.ok()) << v.ToString();

  auto f32 = Whole("values/f32_arange");
  ASSERT_TRUE(f32.ok()) << f32.status().ToString();
  std::vector<float> arange(35);
  for (size_t i = 0; i < arange.size(); ++i) arange[i] = static_cast<float>(41000 + i);
  EXPECT_EQ(As<float>(*f32), arange);
  auto cube = Whole("nested/deep/path/i32");
  ASSERT_TRUE(cube.ok()) << cube.status().ToString();
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(As<int32_t>(*cube)[i], -static_cast<int32_t>(i));
  auto grid = Whole("values/f64_cols");
  ASSERT_TRUE(grid.ok()) << grid.status().ToString();
  for (size_t k = 0; k < 12; ++k) EXPECT_EQ(As<double>(*grid)[k], 10.0 * (k / 4) + (k % 4) + 0.25);
  auto step = Whole("scalar/step");
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(As<int64_t>(*step), std::vector<int64_t>{41});
}

// Every array, row-sharded over this job's ranks, equals the same rows of
// the whole array (at 2 ranks these are the stored boxes; at 1 and 3 they
// are not, and version 1 reads them unchecked).
TEST_F(FormatV1, RestoresAnyShardingAtAnyWorldSize) {
  Result<StepDescription> d = mgr_->Describe(kStep);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  for (const StoredArray& a : d->arrays) {
    SCOPED_TRACE(a.name);
    auto whole = Whole(a.name);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    Box mine = FullBox(a.shape);
    size_t at = 0, row_bytes = whole->size();
    if (!a.shape.empty()) {
      auto [b, e] = SplitRange(a.shape[0], Size(), Rank());
      row_bytes = whole->size() / static_cast<size_t>(a.shape[0]);
      mine.start[0] = b;
      mine.count[0] = e - b;
      at = static_cast<size_t>(b) * row_bytes;
    }
    std::vector<std::byte> out(static_cast<size_t>(*Volume(mine.count)) * DTypeSize(a.dtype));
    ArrayToRestore r{a.name, a.dtype, {{mine, out.data()}}};
    Status s = mgr_->Restore(kStep, std::vector<ArrayToRestore>{r});
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(0, std::memcmp(out.data(), whole->data() + at, out.size()));
  }
}

// A flipped byte in a version-1 step is still found where a read covers
// whole stored boxes, and by Verify.
TEST_F(FormatV1, FlippedByteIsFoundByVerifyAndByAWholeRead) {
  if (Rank() == 0) {
    hid_t f = H5Fopen(io::DataPath(dir_, kStep).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/values/f32_arange", H5P_DEFAULT);
    const haddr_t at = H5Dget_offset(ds) + 2;
    H5Dclose(ds);
    H5Fclose(f);
    int fd = ::open(io::DataPath(dir_, kStep).c_str(), O_RDWR);
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(at)), 1);
    c ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
    ::close(fd);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Status s = Whole("values/f32_arange").status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_THAT(s.message(),
              HasSubstr("array 'values/f32_arange' box [0:4, 0:5]: checksum mismatch"));
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_EQ(mgr_->Verify(kStep).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace mhckpt
