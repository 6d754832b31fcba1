// Integrity: checksums recorded at save, checked on restore and by Verify;
// damage of every kind is a clear DataLoss naming the array and the box, the
// same on every rank; diverging replicas fail the save.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using ::testing::HasSubstr;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

class Integrity : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    Options o;
    o.verify_replicas = true;
    mgr_ = OpenForTest(dir_, o);
    ASSERT_TRUE(mgr_);
    auto [b, e] = SplitRange(shape_[0], Size(), Rank());
    mine_ = Box{{b, 0}, {e - b, shape_[1]}};
    w_ = Fill(DType::kFloat32, shape_, mine_, 1);
    bias_ = Fill(DType::kBFloat16, {8}, FullBox({8}), 2);
    std::vector<ArrayToSave> arrays{
        {"w", DType::kFloat32, shape_, {Shard{mine_, w_.data()}}},
        {"bias", DType::kBFloat16, {8}, {Shard{FullBox({8}), bias_.data()}}}};
    ASSERT_TRUE(mgr_->Save(1, arrays).ok());
    Status s = mgr_->WaitUntilFinished();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // Rank 0 changes the step on disk; everyone waits for it.
  template <typename F>
  void Damage(F f) {
    if (Rank() == 0) f();
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // File offset of a contiguous dataset's first byte (serial HDF5 open).
  haddr_t Offset(const char* name) {
    hid_t f = H5Fopen(io::DataPath(dir_, 1).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    return off;
  }

  void FlipByte(haddr_t at) {
    int fd = ::open(io::DataPath(dir_, 1).c_str(), O_RDWR);
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(at)), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
    ::close(fd);
  }

  Status RestoreW(const Box& box) {
    std::vector<std::byte> out(static_cast<size_t>(*Volume(box.count)) * 4);
    return mgr_->Restore(1,
                         std::vector<ArrayToRestore>{{"w", DType::kFloat32, {{box, out.data()}}}});
  }

  void ExpectDataLoss(const Status& s, const std::string& text) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(text));
    EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
  }

  std::vector<int64_t> shape_{40, 6};
  std::string dir_;
  std::unique_ptr<CheckpointManager> mgr_;
  Box mine_;
  std::vector<std::byte> w_, bias_;
};

TEST_F(Integrity, VerifyReadsEverythingOfAGoodStep) {
  uint64_t bytes = 0;
  Status s = mgr_->Verify(1, &bytes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(bytes, 40u * 6 * 4 + 8 * 2);
  EXPECT_TRUE(RestoreW(mine_).ok());
}

TEST_F(Integrity, FlippedByteIsFoundByVerifyAndByRestoreOfThatBox) {
  // Byte 5 of "w" lies in the first rows: rank 0's box.
  Damage([&] { FlipByte(Offset("/w") + 5); });
  auto [b, e] = SplitRange(shape_[0], Size(), 0);
  std::string box = BoxToString(Box{{b, 0}, {e - b, 6}});
  // Verify names the chunk (rows of the box) whose checksum differs.
  ExpectDataLoss(mgr_->Verify(1), "array 'w' box " + box + " chunk 0 (rows ");
  ExpectDataLoss(mgr_->Verify(1), "checksum mismatch");
  // Restoring exactly that box checks it; every rank reports it.
  Box first{{b, 0}, {e - b, 6}};
  ExpectDataLoss(RestoreW(Rank() == 0 ? first : Box{{0, 0}, {0, 6}}), "array 'w' box " + box);
  // Other arrays are still fine.
  std::vector<std::byte> out(16);
  EXPECT_TRUE(mgr_->Restore(1,
                            std::vector<ArrayToRestore>{
                                {"bias", DType::kBFloat16, {{FullBox({8}), out.data()}}}})
                  .ok());
  EXPECT_TRUE(out == bias_);
}

TEST_F(Integrity, TruncatedFile) {
  Damage([&] { std::filesystem::resize_file(io::DataPath(dir_, 1), 1000); });
  ExpectDataLoss(mgr_->Verify(1), "step 1");
  ExpectDataLoss(RestoreW(mine_), "step 1");
}

TEST_F(Integrity, MissingDataset) {
  Damage([&] {
    hid_t f = H5Fopen(io::DataPath(dir_, 1).c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/bias", H5P_DEFAULT);
    H5Fclose(f);
  });
  ExpectDataLoss(mgr_->Verify(1), "array 'bias': dataset missing");
}

TEST_F(Integrity, ForgedOrDamagedMarker) {
  const std::string marker = io::MarkerPath(dir_, 1);
  Damage([&] {
    std::ifstream in(marker);
    auto j = nlohmann::json::parse(in);
    j["arrays"][1]["boxes"][0]["checksum"] = "xxh3:0000000000000000";  // "w" is arrays[1]
    std::ofstream(marker) << j.dump();
  });
  ExpectDataLoss(mgr_->Verify(1), "array 'w' box");
  Damage([&] { std::ofstream(marker) << "{\"format\": \"mhckpt\", \"format_ver"; });
  ExpectDataLoss(mgr_->Verify(1), "malformed");
  EXPECT_TRUE(mgr_->CommittedSteps().value().empty());
}

TEST_F(Integrity, DivergingReplicasFailTheSave) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  std::vector<std::byte> rng = Fill(DType::kUInt64, {4}, FullBox({4}), 3);
  if (Rank() == Size() - 1) rng[9] ^= std::byte{1};  // non-deterministic replica
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, shape_, {Shard{mine_, w_.data()}}},
      {"bias", DType::kBFloat16, {8}, {Shard{FullBox({8}), bias_.data()}}},
      {"rng", DType::kUInt64, {4}, {Shard{FullBox({4}), rng.data()}}}};
  ASSERT_TRUE(mgr_->Save(2, arrays).ok());
  Status s = mgr_->WaitUntilFinished();
  ExpectDataLoss(s, "replicas differ: array 'rng' box [0:4]");
  EXPECT_THAT(s.message(), HasSubstr("on rank " + std::to_string(Size() - 1)));
  EXPECT_EQ(mgr_->CommittedSteps().value(), std::vector<int64_t>{1});
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir_, 2)));
}

}  // namespace
}  // namespace mhckpt
