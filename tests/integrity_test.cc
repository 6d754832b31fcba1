// Integrity: checksums recorded at save (format 2: in the commit marker;
// format 3: in the step's index file), checked on restore and by Verify;
// damage of every kind, to the data, the marker or the index, is a clear
// DataLoss naming what is damaged, the same on every rank; diverging
// replicas fail the save.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/step_index.h"
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

// Each test runs at every format version a save writes (Options::format_version):
// 2 keeps every checksum in the commit marker, 3 in the step's index file.
class Integrity : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    Options o;
    o.verify_replicas = true;
    o.format_version = GetParam();
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
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir_, 1));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->format_version, GetParam());
    marker_ = *m;
    std::ifstream in(io::MarkerPath(dir_, 1));
    marker_text_.assign(std::istreambuf_iterator<char>(in), {});
    MPI_Barrier(MPI_COMM_WORLD);  // read everywhere before a test damages it
  }

  // Rank 0 changes the step on disk; everyone waits for it.
  template <typename F>
  void Damage(F f) {
    if (Rank() == 0) f();
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // Rank 0 writes step 1's marker as committed, edited by `edit`; everyone
  // waits.
  void EditMarker(const std::function<void(nlohmann::json&)>& edit) {
    Damage([&] {
      nlohmann::json j = nlohmann::json::parse(marker_text_);
      edit(j);
      std::ofstream(io::MarkerPath(dir_, 1), std::ios::trunc) << j.dump();
    });
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

  static void FlipByteOf(const std::string& path, uint64_t at) {
    int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << path;
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(at)), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
    ::close(fd);
  }

  void FlipByte(haddr_t at) { FlipByteOf(io::DataPath(dir_, 1), at); }

  // Restores `box` of "w" (step 1); `*same`: the bytes are those saved.
  Status RestoreW(const Box& box, bool* same = nullptr, const RestoreOptions& options = {}) {
    std::vector<std::byte> out(static_cast<size_t>(*Volume(box.count)) * 4);
    Status s = mgr_->Restore(
        1, std::vector<ArrayToRestore>{{"w", DType::kFloat32, {{box, out.data()}}}}, options);
    if (same != nullptr) *same = out == Fill(DType::kFloat32, shape_, box, 1);
    return s;
  }

  // Restores all of "bias" (step 1); `*same`: the bytes are those saved.
  Status RestoreBias(bool* same) {
    std::vector<std::byte> out(16);
    Status s = mgr_->Restore(
        1, std::vector<ArrayToRestore>{{"bias", DType::kBFloat16, {{FullBox({8}), out.data()}}}});
    *same = out == bias_;
    return s;
  }

  // The box of "w" that rank `r` saved.
  Box BoxOf(int r) const {
    auto [b, e] = SplitRange(shape_[0], Size(), r);
    return Box{{b, 0}, {e - b, shape_[1]}};
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
  io::Marker marker_;        // step 1's, as committed
  std::string marker_text_;  // and its text
};

std::string VersionName(const ::testing::TestParamInfo<int>& info) {
  return "v" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(Formats, Integrity, ::testing::Values(2, 3), VersionName);

TEST_P(Integrity, VerifyReadsEverythingOfAGoodStep) {
  uint64_t bytes = 0;
  Status s = mgr_->Verify(1, &bytes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(bytes, 40u * 6 * 4 + 8 * 2);
  bool same = false;
  s = RestoreW(mine_, &same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
  // The checksums recorded are those of the bytes saved: in the marker
  // (format 2), or in the index beside it (format 3), which the marker sizes.
  const std::string index = io::IndexPath(dir_, 1);
  io::Marker m = marker_;
  if (GetParam() >= 3) {
    for (const io::MarkerArray& a : m.arrays) {
      for (const io::MarkerBox& b : a.boxes) {
        EXPECT_EQ(b.checksum, 0u) << a.name;
        EXPECT_TRUE(b.chunks.empty()) << a.name;
      }
    }
    ASSERT_TRUE(std::filesystem::exists(index));
    EXPECT_EQ(std::filesystem::file_size(index), m.index.bytes);
    Status loaded = io::LoadIndex(index, &m);
    ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  } else {
    EXPECT_FALSE(std::filesystem::exists(index));
  }
  const io::MarkerArray* w = m.Find("w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->boxes.size(), static_cast<size_t>(Size()));
  for (int r = 0; r < Size(); ++r) {
    const io::MarkerBox& b = w->boxes[static_cast<size_t>(r)];
    EXPECT_EQ(b.box, BoxOf(r));
    EXPECT_EQ(b.writer, r);
    std::vector<std::byte> saved = Fill(DType::kFloat32, shape_, b.box, 1);
    EXPECT_EQ(b.checksum, Checksum(saved.data(), saved.size())) << "box " << BoxToString(b.box);
    ASSERT_EQ(b.chunks.size(), 1u);  // 1 MiB chunks: one per box
    EXPECT_EQ(b.chunks[0], b.checksum);
  }
  const io::MarkerArray* bias = m.Find("bias");
  ASSERT_NE(bias, nullptr);
  for (const io::MarkerBox& b : bias->boxes) {
    std::vector<std::byte> saved = Fill(DType::kBFloat16, {8}, b.box, 2);
    EXPECT_EQ(b.checksum, Checksum(saved.data(), saved.size()));
  }
}

TEST_P(Integrity, FlippedByteIsFoundByVerifyAndByRestoreOfThatBox) {
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
  bool same = false;
  Status s = RestoreBias(&same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
}

TEST_P(Integrity, TruncatedFile) {
  Damage([&] { std::filesystem::resize_file(io::DataPath(dir_, 1), 1000); });
  ExpectDataLoss(mgr_->Verify(1), "step 1");
  ExpectDataLoss(RestoreW(mine_), "step 1");
}

TEST_P(Integrity, MissingDataset) {
  Damage([&] {
    hid_t f = H5Fopen(io::DataPath(dir_, 1).c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/bias", H5P_DEFAULT);
    H5Fclose(f);
  });
  ExpectDataLoss(mgr_->Verify(1), "array 'bias': dataset missing");
}

TEST_P(Integrity, MalformedMarker) {
  Damage(
      [&] { std::ofstream(io::MarkerPath(dir_, 1)) << "{\"format\": \"mhckpt\", \"format_ver"; });
  ExpectDataLoss(mgr_->Verify(1), "malformed");
  ExpectDataLoss(RestoreW(mine_), "malformed");
  EXPECT_TRUE(mgr_->CommittedSteps().value().empty());
}

TEST_P(Integrity, DivergingReplicasFailTheSave) {
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

// Format 2: the checksums are in the marker; forging them is found.
class MarkerChecksums : public Integrity {};
INSTANTIATE_TEST_SUITE_P(Format2, MarkerChecksums, ::testing::Values(2), VersionName);

TEST_P(MarkerChecksums, ForgedChecksumsAreDataLoss) {
  const std::string box = BoxToString(BoxOf(0));
  // A forged box checksum (its chunks agreeing with the file): Verify.
  EditMarker([](nlohmann::json& j) {
    ASSERT_EQ(j["arrays"][1]["name"], "w");  // arrays by name: "bias", "w"
    ASSERT_TRUE(j["arrays"][1]["boxes"][0].contains("checksum"));
    j["arrays"][1]["boxes"][0]["checksum"] = "xxh3:0000000000000000";
  });
  ExpectDataLoss(mgr_->Verify(1), "array 'w' box " + box);
  // A forged chunk checksum: Verify, and a restore reading that chunk.
  EditMarker([](nlohmann::json& j) {
    ASSERT_EQ(j["arrays"][1]["boxes"][0]["chunks"].size(), 1u);
    j["arrays"][1]["boxes"][0]["chunks"][0] = "xxh3:0000000000000000";
  });
  ExpectDataLoss(mgr_->Verify(1), "array 'w' box " + box + " chunk 0");
  ExpectDataLoss(RestoreW(Rank() == 0 ? BoxOf(0) : Box{{0, 0}, {0, 6}}),
                 "array 'w' box " + box + " chunk 0 (rows ");
  // The marker as saved: fine again.
  EditMarker([](nlohmann::json&) {});
  EXPECT_TRUE(mgr_->Verify(1).ok());
}

// Format 3: the checksums are in the step's index (io/step_index.h), and
// the marker describes a regular sharding as a grid of writers. Damage to
// either is a DataLoss naming what is damaged, the same on every rank, and a
// restore reads only the index records of the boxes it reads.
class StepIndex : public Integrity {
 protected:
  void SetUp() override {
    Integrity::SetUp();
    if (HasFatalFailure()) return;
    index_ = io::IndexPath(dir_, 1);
    std::ifstream in(index_, std::ios::binary);
    saved_index_.assign(std::istreambuf_iterator<char>(in), {});
    ASSERT_EQ(saved_index_.size(), marker_.index.bytes);
    Result<io::IndexLayout> layout = io::IndexLayout::Of(marker_, "the marker");
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    layout_ = *layout;
    ASSERT_EQ(marker_.arrays[kW].name, "w");
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // Rank 0 puts the index back as saved; everyone waits.
  void PutIndexBack() {
    Damage([&] { std::ofstream(index_, std::ios::binary | std::ios::trunc) << saved_index_; });
  }

  static constexpr size_t kW = 1;  // arrays by name: "bias", "w"
  std::string index_;
  std::string saved_index_;
  std::optional<io::IndexLayout> layout_;
};
INSTANTIATE_TEST_SUITE_P(Format3, StepIndex, ::testing::Values(3), VersionName);

TEST_P(StepIndex, FlippedRecordByteIsDataLossForThatBoxOnly) {
  const std::string box = "array 'w' box " + BoxToString(BoxOf(0));
  const uint64_t at = layout_->offset(kW, 0), bytes = layout_->record_bytes(kW, 0);
  ASSERT_EQ(bytes, 24u);  // the box's checksum, its one chunk's, the check word
  const Box none{{0, 0}, {0, 6}};
  for (uint64_t flip : {at, at + 8, at + bytes - 1}) {
    SCOPED_TRACE(fmt::format("byte {} of the index flipped", flip));
    PutIndexBack();
    Damage([&] { FlipByteOf(index_, flip); });
    // Restoring that box (on rank 0 only) fails its record's check, on
    // every rank.
    Status s = RestoreW(Rank() == 0 ? BoxOf(0) : none);
    ExpectDataLoss(s, "index '" + index_ + "'");
    EXPECT_THAT(s.message(), HasSubstr(box));
    EXPECT_THAT(s.message(), HasSubstr("fails its check"));
    // So does restoring all of "w" on every rank, and Verify.
    s = RestoreW(FullBox(shape_));
    ExpectDataLoss(s, "index '" + index_ + "'");
    EXPECT_THAT(s.message(), HasSubstr(box));
    s = mgr_->Verify(1);
    ExpectDataLoss(s, "index '" + index_ + "'");
    EXPECT_THAT(s.message(), HasSubstr(box));
  }
  // The records of other boxes are read, and checked, without it.
  bool same = false;
  Status s = RestoreBias(&same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
  if (Size() > 1) {
    s = RestoreW(BoxOf(Size() - 1), &same);
    EXPECT_TRUE(s.ok() && same) << s.ToString();
  }
  // An unchecked restore does not read the index.
  RestoreOptions unchecked;
  unchecked.verify_checksums = false;
  s = RestoreW(FullBox(shape_), &same, unchecked);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
  // The index as saved: fine again.
  PutIndexBack();
  s = RestoreW(FullBox(shape_), &same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
  EXPECT_TRUE(mgr_->Verify(1).ok());
}

TEST_P(StepIndex, TruncatedIndex) {
  // Without its last 8 bytes: the check word of the last box of "w".
  const std::string last = "array 'w' box " + BoxToString(BoxOf(Size() - 1));
  Damage([&] { std::filesystem::resize_file(index_, saved_index_.size() - 8); });
  Status s = RestoreW(FullBox(shape_));
  ExpectDataLoss(s, "index '" + index_ + "'");
  EXPECT_THAT(s.message(), HasSubstr(last));
  ExpectDataLoss(mgr_->Verify(1),
                 fmt::format("index '{}' is {} bytes; the commit marker says {}", index_,
                             saved_index_.size() - 8, saved_index_.size()));
  // The records before the cut are whole.
  bool same = false;
  s = RestoreBias(&same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
  // Cut inside the header: every read of the index fails.
  Damage([&] { std::filesystem::resize_file(index_, 10); });
  ExpectDataLoss(RestoreBias(&same), "index '" + index_ + "'");
  ExpectDataLoss(RestoreW(mine_), "index '" + index_ + "'");
  ExpectDataLoss(mgr_->Verify(1), "index '" + index_ + "'");
}

TEST_P(StepIndex, MissingIndex) {
  Damage([&] { std::filesystem::remove(index_); });
  const std::string missing = "index '" + index_ + "' is missing";
  ExpectDataLoss(RestoreW(mine_), missing);
  ExpectDataLoss(mgr_->Verify(1), missing);
  bool same = false;
  ExpectDataLoss(RestoreBias(&same), missing);
  // Unchecked, the data file alone is read.
  RestoreOptions unchecked;
  unchecked.verify_checksums = false;
  Status s = RestoreW(FullBox(shape_), &same, unchecked);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
}

TEST_P(StepIndex, AnIndexOfAnotherStepOrSave) {
  // The header names the step.
  Damage([&] { FlipByteOf(index_, 8); });
  ExpectDataLoss(RestoreW(mine_), "index '" + index_ + "' is not the index of step 1");
  ExpectDataLoss(mgr_->Verify(1), "is not the index of step 1");
  // Step 2, other bytes in "w": its record of rank 0's box passes its own
  // check in step 1's index (same array, same box), but not the data's
  // checksum, nor the index checksum in step 1's marker.
  PutIndexBack();
  std::vector<std::byte> other = Fill(DType::kFloat32, shape_, mine_, 7);
  std::vector<ArrayToSave> arrays{
      {"w", DType::kFloat32, shape_, {Shard{mine_, other.data()}}},
      {"bias", DType::kBFloat16, {8}, {Shard{FullBox({8}), bias_.data()}}}};
  ASSERT_TRUE(mgr_->Save(2, arrays).ok());
  Status s = mgr_->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  Damage([&] {
    std::ifstream in(io::IndexPath(dir_, 2), std::ios::binary);
    std::string two(std::istreambuf_iterator<char>(in), {});
    ASSERT_EQ(two.size(), saved_index_.size());
    const uint64_t at = layout_->offset(kW, 0), bytes = layout_->record_bytes(kW, 0);
    std::string one = saved_index_;
    one.replace(at, bytes, two.substr(at, bytes));
    std::ofstream(index_, std::ios::binary | std::ios::trunc) << one;
  });
  const std::string box = "array 'w' box " + BoxToString(BoxOf(0));
  s = RestoreW(FullBox(shape_));
  ExpectDataLoss(s, box + " chunk 0 (rows ");
  EXPECT_THAT(s.message(), HasSubstr("checksum mismatch"));
  ExpectDataLoss(mgr_->Verify(1), "index '" + index_ + "': its records' checksum is ");
}

TEST_P(StepIndex, MarkerWhoseIndexDisagrees) {
  const std::string marker = io::MarkerPath(dir_, 1);
  // The size it records.
  EditMarker(
      [](nlohmann::json& j) { j["index"]["bytes"] = j["index"]["bytes"].get<uint64_t>() + 8; });
  const std::string size = fmt::format(
      "commit marker '{}': the index is {} bytes, but its boxes' "
      "records take {}",
      marker, saved_index_.size() + 8, saved_index_.size());
  ExpectDataLoss(mgr_->Verify(1), size);
  ExpectDataLoss(RestoreW(mine_), size);
  // The checksum of its records: Verify reads every record and finds it; a
  // restore checks each record it reads by its own check word.
  EditMarker([](nlohmann::json& j) { j["index"]["checksum"] = "xxh3:0000000000000000"; });
  ExpectDataLoss(mgr_->Verify(1), "index '" + index_ + "': its records' checksum is ");
  bool same = false;
  Status s = RestoreW(FullBox(shape_), &same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
  // Another index file.
  EditMarker([](nlohmann::json& j) { j["index"]["file"] = "other.bin"; });
  ExpectDataLoss(mgr_->Verify(1), "unexpected index file 'other.bin'");
  EditMarker([](nlohmann::json& j) { j.erase("index"); });
  ExpectDataLoss(mgr_->Verify(1), "missing field 'index'");
  ExpectDataLoss(RestoreW(mine_), "missing field 'index'");
  EditMarker([](nlohmann::json&) {});
  EXPECT_TRUE(mgr_->Verify(1).ok());
}

TEST_P(StepIndex, DamagedGridOrWriters) {
  EditMarker([](nlohmann::json& j) {
    // "w" is one grid: rows cut among the ranks, one column block.
    ASSERT_FALSE(j["arrays"][1].contains("boxes"));
    ASSERT_EQ(j["arrays"][1]["grid"].size(), 2u);
    ASSERT_EQ(j["arrays"][1]["grid"][1], nlohmann::json::array({0, 6}));
    ASSERT_EQ(j["arrays"][1]["writers"].size(), static_cast<size_t>(Size()));
  });
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string error;
  };
  const std::vector<Case> cases{
      {[](nlohmann::json& j) {
         j["arrays"][1]["grid"][1] = {0, 7};
       },
       "array 'w': the grid's cuts of dimension 1 do not rise from 0 to 6"},
      {[](nlohmann::json& j) { j["arrays"][1]["grid"][0].back() = 39; },
       "array 'w': the grid's cuts of dimension 0 do not rise from 0 to 40"},
      {[](nlohmann::json& j) {
         j["arrays"][1]["grid"][1] = {0, 3, 3, 6};
       },
       "array 'w': the grid's cuts of dimension 1 do not rise from 0 to 6"},
      {[](nlohmann::json& j) { j["arrays"][1]["grid"].erase(1); },
       "array 'w': a grid of 1 dimensions for a shape of 2"},
      {[](nlohmann::json& j) { j["arrays"][1]["writers"].push_back(0); },
       fmt::format("array 'w': a grid of {} cells with {} writers", Size(), Size() + 1)},
      {[](nlohmann::json& j) {
         j["arrays"][1]["grid"][1] = {0, 3, 6};
       },
       fmt::format("array 'w': a grid of more cells than its {} writers", Size())},
      {[](nlohmann::json& j) { j["arrays"][1]["writers"][0] = Size(); },
       fmt::format("writer rank {} outside world size {}", Size(), Size())},
      {[](nlohmann::json& j) { j["arrays"][1]["writers"][0] = -1; },
       "array 'w': writer -1 out of range"},
      {[](nlohmann::json& j) { j["arrays"][1].erase("grid"); }, "missing field 'grid'"},
      {[](nlohmann::json& j) { j["arrays"][1].erase("writers"); }, "missing field 'writers'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    EditMarker(c.edit);
    ExpectDataLoss(mgr_->Verify(1), c.error);
    ExpectDataLoss(RestoreW(mine_), c.error);
  }
  EditMarker([](nlohmann::json&) {});
  bool same = false;
  Status s = RestoreW(FullBox(shape_), &same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
}

}  // namespace
}  // namespace mhckpt
