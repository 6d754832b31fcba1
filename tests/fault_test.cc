// Agreed errors: a failing system call on one rank, or a genuinely full file
// system, gives the same Status on every rank, naming the rank, the operation
// and the cause; nothing is committed; nothing hangs; the previous step still
// restores bit-exactly; the next save succeeds once the cause is gone.
// Transient errors (short writes, EINTR) are retried and change nothing.
#include <sys/mount.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "io/catalog.h"
#include "io/layout.h"
#include "io/marker.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using ::testing::EndsWith;
using testing::Fill;
using testing::FreshDir;
using ::testing::HasSubstr;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;
using ::testing::StartsWith;
using testing::SumOverRanks;

class Faults : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(fault::Configure("").ok()); }

  // Use as ASSERT_TRUE(Open(dir)): false (on every rank) if Open failed.
  bool Open(const std::string& dir, const Options& options = {}) {
    dir_ = dir;
    mgr_ = OpenForTest(dir_, options);
    return mgr_ != nullptr;
  }

  // Saves `rows` x 1024 float32 split over the ranks (seeded by the step).
  Status SaveStep(int64_t step, int64_t rows = 64) {
    std::vector<int64_t> shape{rows, 1024};
    auto [b, e] = SplitRange(rows, Size(), Rank());
    Box box{{b, 0}, {e - b, 1024}};
    auto data = Fill(DType::kFloat32, shape, box, step);
    mgr_->Save(step, std::vector<ArrayToSave>{{"w", DType::kFloat32, shape, {{box, data.data()}}}})
        .IgnoreError();
    return mgr_->WaitUntilFinished();
  }

  // Every rank restores the whole array, reading it itself (read_once off,
  // as in RestoreWithFault), and gets the saved bytes.
  void ExpectRestores(int64_t step, int64_t rows = 64) {
    std::vector<int64_t> shape{rows, 1024};
    std::vector<std::byte> out(static_cast<size_t>(rows) * 1024 * 4);
    RestoreOptions options;
    options.read_once = false;
    Status s = mgr_->Restore(
        step, std::vector<ArrayToRestore>{{"w", DType::kFloat32, {{FullBox(shape), out.data()}}}},
        options);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(out == Fill(DType::kFloat32, shape, FullBox(shape), step));
  }

  // The box of "w" that rank 0 saved (SaveStep): the first a whole-array
  // read reads, and the one its errors name.
  static std::string FirstStoredBox(int64_t rows = 64) {
    return BoxToString(Box{{0, 0}, {SplitRange(rows, Size(), 0).second, 1024}});
  }

  void ExpectAgreedFailure(const Status& s, int64_t step, const std::string& text) {
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(text));
    EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
    EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir_, step)));
  }

  // The Status of a restore of `step` (the whole array), with `spec`
  // configured for its duration only. Every rank reads the array itself
  // (read_once off: otherwise one rank would read it for all), so that a
  // fault armed on any rank is met.
  Status RestoreWithFault(int64_t step, const std::string& spec, int64_t rows = 64,
                          bool direct_reads = true) {
    std::vector<int64_t> shape{rows, 1024};
    std::vector<std::byte> out(static_cast<size_t>(rows) * 1024 * 4);
    EXPECT_TRUE(fault::Configure(spec).ok());
    RestoreOptions options;
    options.read_once = false;
    options.direct_reads = direct_reads;
    Status s = mgr_->Restore(
        step, std::vector<ArrayToRestore>{{"w", DType::kFloat32, {{FullBox(shape), out.data()}}}},
        options);
    EXPECT_TRUE(fault::Configure("").ok());
    return s;
  }

  // After failed saves of steps 2 ..: faults off, only step 1 committed and
  // restoring, and step `step` saves and restores.
  void ExpectOnlyStep1ThenSavesOn(int64_t step) {
    ASSERT_TRUE(fault::Configure("").ok());
    EXPECT_EQ(mgr_->CommittedSteps().value(), std::vector<int64_t>{1});
    ExpectRestores(1);
    ASSERT_TRUE(SaveStep(step).ok());
    ExpectRestores(step);
  }

  // Collective: how often the configured faults fired, over all ranks.
  static uint64_t FiredEverywhere() { return SumOverRanks(static_cast<uint64_t>(fault::Fired())); }

  int Last() const { return Size() - 1; }

  std::string dir_;
  std::unique_ptr<CheckpointManager> mgr_;
};

TEST_F(Faults, EnospcOnOneRanksDataWrite) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(fault::Configure(fmt::format("rank={},point=h5_write,action=enospc", Last())).ok());
  ExpectAgreedFailure(
      SaveStep(2), 2,
      fmt::format("rank {}: No space left on device (injected at h5_write)", Last()));
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_EQ(mgr_->CommittedSteps().value(), std::vector<int64_t>{1});
  ExpectRestores(1);
  ASSERT_TRUE(SaveStep(3).ok());
  ExpectRestores(3);
}

TEST_F(Faults, EioOnTheMarkerFsync) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(fault::Configure("rank=0,point=fsync,action=eio").ok());  // files: the marker
  ExpectAgreedFailure(SaveStep(2), 2, "rank 0: commit marker: fsync");
  EXPECT_FALSE(std::filesystem::exists(io::MarkerPath(dir_, 2) + ".tmp"));
  ASSERT_TRUE(fault::Configure("").ok());
  ExpectRestores(1);
  ASSERT_TRUE(SaveStep(3).ok());
}

TEST_F(Faults, RenameAndPermissionErrors) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(fault::Configure("rank=0,point=rename,action=enospc").ok());
  ExpectAgreedFailure(SaveStep(1), 1, "rename");
  ASSERT_TRUE(fault::Configure("rank=0,point=mkdir,action=eacces").ok());
  ExpectAgreedFailure(SaveStep(2), 2, "Permission denied");
  ASSERT_TRUE(fault::Configure("rank=0,point=fsync_dir,action=eio").ok());
  ExpectAgreedFailure(SaveStep(3), 3, "rank 0: fsync directory");
  ASSERT_TRUE(fault::Configure("rank=0,point=fallocate,action=enospc").ok());
  ExpectAgreedFailure(SaveStep(4), 4, "rank 0: reserve");
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_TRUE(mgr_->CommittedSteps().value().empty());
  ASSERT_TRUE(SaveStep(5).ok());
  ExpectRestores(5);
}

TEST_F(Faults, InjectedFailureAtEachPhaseIsAgreed) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(SaveStep(1).ok());
  int64_t step = 2;
  for (const char* point : {"after_snapshot", "plan", "mid_write", "after_flush", "index_write"}) {
    ASSERT_TRUE(fault::Configure(fmt::format("rank={},point={},action=error", Last(), point)).ok());
    Status s = SaveStep(step);
    EXPECT_THAT(s.message(), HasSubstr(fmt::format("injected failure at {}", point))) << point;
    EXPECT_TRUE(SameOnAllRanks(s)) << point;
    EXPECT_FALSE(std::filesystem::exists(io::MarkerPath(dir_, step))) << point;
    ++step;
  }
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_EQ(mgr_->CommittedSteps().value(), std::vector<int64_t>{1});
  ASSERT_TRUE(SaveStep(step).ok());
}

// A write that reaches the disk fails on one rank, with EIO or with ENOSPC (a
// file system that only finds out it is full when it writes back): the data
// file's fsync (H5Fflush -> MPI_File_sync), or, format 3, the writer's index
// records. The same error on every rank, no marker, and the job saves on.
TEST_F(Faults, DataFileFsyncOrIndexWriteFails) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(SaveStep(1).ok());
  int64_t step = 2;
  for (const char* point : {"data_fsync", "index_write"}) {
    for (const char* action : {"eio", "enospc"}) {
      ASSERT_TRUE(
          fault::Configure(fmt::format("rank={},point={},action={}", Last(), point, action)).ok());
      const std::string why =
          action == std::string("eio") ? std::strerror(EIO) : std::strerror(ENOSPC);
      const std::string text =
          point == std::string("data_fsync")
              ? fmt::format("rank {}: flush '{}': {} (injected at data_fsync)", Last(),
                            io::DataPath(dir_, step), why)
              : fmt::format("rank {}: write '{}': {}", Last(), io::IndexPath(dir_, step), why);
      ExpectAgreedFailure(SaveStep(step), step, text);
      ++step;
    }
  }
  ExpectOnlyStep1ThenSavesOn(step);
}

// Subfiles, one per rank: the last rank's data write, its subfile's fsync
// and its index records fail in turn; each time every rank returns the same
// error naming that rank and what failed, no step is left,
// and the job saves on and restores from the subfiles.
TEST_F(Faults, SubfileWriteFsyncOrIndexFails) {
  ASSERT_TRUE(Open(FreshDir(), Options{.files = DataFiles::PerRanks(1)}));
  ASSERT_TRUE(SaveStep(1).ok());
  EXPECT_TRUE(std::filesystem::exists(io::SubfilePath(dir_, 1, Last())));
  int64_t step = 2;
  for (const std::string point : {"h5_write", "data_fsync", "index_write"}) {
    ASSERT_TRUE(fault::Configure(fmt::format("rank={},point={},action=eio", Last(), point)).ok());
    const std::string named = point == "h5_write"      ? "(injected at h5_write)"
                              : point == "index_write" ? io::IndexPath(dir_, step)
                                                       : io::SubfilePath(dir_, step, Last());
    Status s = SaveStep(step);
    ExpectAgreedFailure(s, step, fmt::format("rank {}: ", Last()));
    EXPECT_THAT(s.message(), HasSubstr(named)) << point;
    ++step;
  }
  ExpectOnlyStep1ThenSavesOn(step);
}

// Short writes and EINTR are retried: the save commits on every rank and
// restores bit-exactly.
TEST_F(Faults, ShortWritesAndEintrAreRetried) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(fault::Configure("point=write,action=short").ok());  // every write, all ranks
  Status s = SaveStep(2);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_GT(FiredEverywhere(), 1u) << "the marker is written in several short writes";
  ASSERT_TRUE(fault::Configure("point=write,action=eintr,times=3").ok());
  s = SaveStep(3);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_EQ(FiredEverywhere(), 3u);
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_EQ(mgr_->CommittedSteps().value(), (std::vector<int64_t>{1, 2, 3}));
  // A read interrupted three times (the marker, read by rank 0) still restores.
  ASSERT_TRUE(fault::Configure("rank=0,point=read,action=eintr,times=3").ok());
  ExpectRestores(3);
  EXPECT_EQ(FiredEverywhere(), 3u);
  ASSERT_TRUE(fault::Configure("").ok());
  ExpectRestores(1);
  ExpectRestores(2);
}

// EIO on a read: the commit marker (rank 0) or the data (the last rank),
// read by offset (pread) or, where the marker records no offsets, through
// HDF5. Restore fails the same way everywhere, naming the rank, the array
// and the box; once the cause is gone, the step restores bit-exactly.
TEST_F(Faults, EioOnRead) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(SaveStep(1).ok());
  Status s = RestoreWithFault(1, "rank=0,point=read,action=eio");
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_THAT(s.message(),
              HasSubstr(fmt::format("rank 0: read the commit marker of step 1: read '{}': {}",
                                    io::MarkerPath(dir_, 1), std::strerror(EIO))));
  EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
  const int64_t offset = io::ReadMarker(io::MarkerPath(dir_, 1)).value().Find("w")->offset;
  const std::string pread_eio = fmt::format("rank={},point=pread,action=eio", Last());
  const std::string where = fmt::format("rank {}: step 1: array 'w' box {}: pread '{}' at byte ",
                                        Last(), FirstStoredBox(), io::DataPath(dir_, 1));
  s = RestoreWithFault(1, pread_eio, 64, /*direct_reads=*/false);
  EXPECT_EQ(
      s, Status(StatusCode::kIoError, fmt::format("{}{}: {}", where, offset, std::strerror(EIO))))
      << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
  // With direct reads (the default) a file system that takes O_DIRECT reads
  // the aligned span around the array, and the message says so.
  s = RestoreWithFault(1, pread_eio);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_THAT(s.message(), StartsWith(where)) << s.ToString();
  EXPECT_THAT(s.message(), EndsWith(fmt::format(": {}", std::strerror(EIO)))) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
  ExpectRestores(1);
  ASSERT_TRUE(testing::ForgetOffsets(dir_, 1));  // now read through HDF5
  s = RestoreWithFault(1, fmt::format("rank={},point=h5_read,action=eio", Last()));
  EXPECT_EQ(s, Status(StatusCode::kIoError,
                      fmt::format("rank {}: step 1: array 'w' box {}: {} (injected at h5_read)",
                                  Last(), FirstStoredBox(), std::strerror(EIO))))
      << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
  ExpectRestores(1);
}

// Short reads and EINTR on the reads by offset are retried: the restore is
// OK on every rank and bit-exact. A file that really ends early is an
// agreed DataLoss naming the array, the box and where the file ends.
TEST_F(Faults, ShortReadsAndEintrOnPreadAreRetriedAndEndOfFileIsDataLoss) {
  ASSERT_TRUE(Open(FreshDir()));
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(fault::Configure("point=pread,action=short").ok());  // every pread, all ranks
  ExpectRestores(1);
  EXPECT_GT(FiredEverywhere(), static_cast<uint64_t>(Size())) << "every rank read in halves";
  ASSERT_TRUE(
      fault::Configure(fmt::format("rank={},point=pread,action=eintr,times=3", Last())).ok());
  ExpectRestores(1);
  EXPECT_EQ(FiredEverywhere(), 3u);
  ASSERT_TRUE(fault::Configure("").ok());
  const int64_t offset = io::ReadMarker(io::MarkerPath(dir_, 1)).value().Find("w")->offset;
  const int64_t cut = offset + 1000;  // inside the first row
  MPI_Barrier(MPI_COMM_WORLD);
  if (Rank() == 0) std::filesystem::resize_file(io::DataPath(dir_, 1), cut);
  MPI_Barrier(MPI_COMM_WORLD);
  Status s = RestoreWithFault(1, "");
  const std::string failed =
      Size() == 1 ? ""
                  : fmt::format(" (and {} more rank{} failed)", Size() - 1, Size() > 2 ? "s" : "");
  EXPECT_EQ(s, Status(StatusCode::kDataLoss,
                      fmt::format("rank 0: step 1: array 'w' box {}: '{}' ends before byte {} "
                                  "(truncated?){}",
                                  FirstStoredBox(), io::DataPath(dir_, 1), cut, failed)))
      << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
}

// Retention's unlink of an old marker, or its removal of the old step's
// files, fails on rank 0. Retention failures are logged, not returned (the
// new step is committed either way, coordinator/save.cc step 7): the save
// is OK on every rank, and every step that is still committed restores.
TEST_F(Faults, RetentionDeletesFail) {
  Options o;
  o.max_to_keep = 1;
  ASSERT_TRUE(Open(FreshDir(), o));
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(fault::Configure("rank=0,point=unlink,action=eio").ok());
  Status s = SaveStep(2);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  ASSERT_TRUE(fault::Configure("").ok());
  // The marker could not be unlinked: step 1 is still committed and whole.
  EXPECT_EQ(mgr_->CommittedSteps().value(), (std::vector<int64_t>{1, 2}));
  ExpectRestores(1);
  ExpectRestores(2);
  // Removal fails: retention has retired steps 1 and 2 already (markers gone,
  // directories renamed out of the listing); their files stay where the
  // deleter left them, and the next Open removes them.
  ASSERT_TRUE(fault::Configure("rank=0,point=remove_step,action=eio").ok());
  s = SaveStep(3);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_EQ(mgr_->CommittedSteps().value(), std::vector<int64_t>{3});
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir_, 1)));
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir_, 2)));
  ExpectRestores(3);
  mgr_.reset();  // the deleter finishes (and fails) before the manager is gone
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_EQ(io::RetiredDirs(dir_).value().size(), 2u);
  ASSERT_TRUE(Open(dir_, o));
  EXPECT_TRUE(io::RetiredDirs(dir_).value().empty());
  ASSERT_TRUE(SaveStep(4).ok());
  EXPECT_EQ(mgr_->CommittedSteps().value(), std::vector<int64_t>{4});
  ExpectRestores(4);
}

TEST_F(Faults, GenuinelyFullFileSystem) {
  // Outside FreshDir's tree, so a mount left by a killed run cannot block it.
  const std::string mnt = fmt::format("/tmp/mhckpt-tiny-np{}", Size());
  int mounted = 0;
  if (Rank() == 0) {
    ::umount2(mnt.c_str(), MNT_DETACH);
    std::filesystem::remove_all(mnt);
    std::filesystem::create_directories(mnt);
    mounted = ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m") == 0 ? 1 : 0;
    if (!mounted) std::fprintf(stderr, "mount tmpfs: %s\n", std::strerror(errno));
  }
  MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!mounted) GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  ASSERT_TRUE(Open(mnt));
  ASSERT_TRUE(SaveStep(1, 64).ok());  // 256 KiB
  Status s = SaveStep(2, 2048);       // 8 MiB into what is left of 4 MiB
  // Caught where rank 0 reserves the step's space, before any collective flush.
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("rank 0: reserve "));
  EXPECT_THAT(s.message(), HasSubstr("No space left on device"));
  EXPECT_FALSE(std::filesystem::exists(io::MarkerPath(dir_, 2)));
  ExpectRestores(1, 64);
  ASSERT_TRUE(SaveStep(3, 64).ok()) << "space is back once the failed step is removed";
  ExpectRestores(3, 64);
  mgr_.reset();
  MPI_Barrier(MPI_COMM_WORLD);
  if (Rank() == 0) ::umount(mnt.c_str());
}

}  // namespace
}  // namespace mhckpt
