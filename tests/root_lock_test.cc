// One job per root, inside one job: a second Open of a root in use fails on
// every rank naming the holder and removes nothing; a reader opens without
// ownership; a lease of another machine with a fresh heartbeat keeps the root
// in use (the lock may not reach it), a stale one or one of this machine is
// taken over; the heartbeat advances.
// tests/lock_test.py runs the same with two separate mpirun jobs.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/posix_file.h"
#include "io/root_lock.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using ::testing::HasSubstr;
using testing::OpenAgreed;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

std::string LeasePath(const std::string& root) {
  return root + "/" + std::string(io::kLeaseFileName);
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Rank 0's pid, on every rank.
int64_t Rank0Pid() {
  int64_t pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  return pid;
}

// Collective: rank 0 writes `lease` as the root's lease file.
void WriteLease(const std::string& root, const io::Lease& lease) {
  if (Rank() == 0) {
    std::filesystem::create_directories(root);
    std::ofstream(LeasePath(root)) << io::LeaseToJson(lease);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Collective: rank 0 makes an uncommitted step directory, as a save in
// progress has it.
void MakeStepInProgress(const std::string& root, int64_t step) {
  if (Rank() == 0) {
    std::filesystem::create_directories(io::StepDir(root, step));
    std::ofstream(io::DataPath(root, step)) << "half-written";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

Status SaveOne(CheckpointManager& mgr, int64_t step) {
  const std::vector<int64_t> shape{16, 8};
  auto [b, e] = SplitRange(16, Size(), Rank());
  Box box{{b, 0}, {e - b, 8}};
  auto data = Fill(DType::kFloat32, shape, box, static_cast<uint64_t>(step));
  mgr.Save(step, std::vector<ArrayToSave>{{"w", DType::kFloat32, shape, {{box, data.data()}}}})
      .IgnoreError();
  return mgr.WaitUntilFinished();
}

void ExpectInUse(const Status& s, const std::string& root, const std::string& holder,
                 const std::string& why) {
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(fmt::format(
                               "checkpoint root '{}' is in use by another job ({}", root, holder)));
  EXPECT_THAT(s.message(), HasSubstr(why));
  EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
}

TEST(RootLock, SecondOpenFailsEverywhereAndRemovesNothing) {
  const std::string dir = FreshDir();
  auto first = OpenForTest(dir);
  ASSERT_TRUE(first);
  ASSERT_TRUE(SaveOne(*first, 1).ok());
  MakeStepInProgress(dir, 2);
  auto second = OpenAgreed(dir);
  ExpectInUse(second.status(), dir,
              fmt::format("host '{}', pid {}", io::CurrentProcessLease().host, Rank0Pid()),
              "it holds the lock on mhckpt.lock");
  EXPECT_TRUE(std::filesystem::exists(io::DataPath(dir, 2))) << "the holder's step was removed";
  EXPECT_EQ(first->CommittedSteps().value(), std::vector<int64_t>{1});
  ASSERT_TRUE(SaveOne(*first, 3).ok()) << "the holder goes on saving";

  first.reset();  // releases the root: no lease left behind
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(std::filesystem::exists(LeasePath(dir)));
  auto third = OpenForTest(dir);
  ASSERT_TRUE(third);
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, 2))) << "the owner cleans up";
  EXPECT_EQ(third->CommittedSteps().value(), (std::vector<int64_t>{1, 3}));
}

TEST(RootLock, ReaderOpensWithoutOwnershipAndCannotSave) {
  const std::string dir = FreshDir();
  auto owner = OpenForTest(dir);
  ASSERT_TRUE(owner);
  MakeStepInProgress(dir, 5);
  Options o;
  o.own_root = false;
  auto reader = OpenForTest(dir, o);
  ASSERT_TRUE(reader);
  EXPECT_TRUE(std::filesystem::exists(io::DataPath(dir, 5)));
  Status s = SaveOne(*reader, 6);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("opened without ownership"));
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, 6)));
}

// Where the lock does not reach the holder (NFS with local_lock, Lustre with
// localflock), its lease decides: here the lock is free and only the lease
// file says who holds the root.
TEST(RootLock, FreshLeaseOfAnotherHostKeepsTheRootInUse) {
  const std::string dir = FreshDir();
  io::Lease other{"other-host", 4242, "job-7", "other-boot", NowMs() - 5000, NowMs() - 1000};
  WriteLease(dir, other);
  MakeStepInProgress(dir, 2);
  auto opened = OpenAgreed(dir);
  ExpectInUse(opened.status(), dir, "host 'other-host', pid 4242, job 'job-7', heartbeat ",
              "its lease's heartbeat is younger than the lease time of 60 s");
  EXPECT_TRUE(std::filesystem::exists(io::DataPath(dir, 2)));

  other.heartbeat_unix_ms = NowMs() - 61'000;  // stale: the holder stopped renewing it
  WriteLease(dir, other);
  auto taken = OpenForTest(dir);
  ASSERT_TRUE(taken);
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, 2)));
  if (Rank() == 0) {
    auto lease = io::ParseLease(io::ReadSmallFile(LeasePath(dir), 4096).value());
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->pid, ::getpid());
  }
}

// A lease of a process under this kernel (this machine): the kernel's lock
// reached it, so a granted lock means it is gone — even if its pid is still
// there (a zombie being reaped after SIGKILL, as after a crash under mpirun).
// A lease from another boot with this host name is another machine.
TEST(RootLock, LeaseOfThisMachineIsDecidedByTheLock) {
  const std::string dir = FreshDir();
  io::Lease other_machine = io::CurrentProcessLease();
  other_machine.pid = 4242;
  other_machine.boot_id = "00000000-0000-0000-0000-000000000000";
  WriteLease(dir, other_machine);
  auto opened = OpenAgreed(dir);
  ExpectInUse(opened.status(), dir, fmt::format("host '{}', pid 4242", other_machine.host),
              "it runs on another machine");

  io::Lease alive = io::CurrentProcessLease();
  alive.pid = ::getppid();  // a live process of this machine that holds no lock
  WriteLease(dir, alive);
  MakeStepInProgress(dir, 9);
  auto taken = OpenForTest(dir);
  ASSERT_TRUE(taken) << "the lock decides on this machine";
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, 9)));
}

// The heartbeat rewrites the lease every quarter of the lease time: polled
// until it has advanced, with a deadline far beyond the period.
TEST(RootLock, HeartbeatAdvances) {
  const std::string dir = FreshDir();
  Options o;
  o.root_lease_seconds = 0.4;
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  if (Rank() == 0) {
    auto read = [&] {
      return io::ParseLease(io::ReadSmallFile(LeasePath(dir), 4096).value()).value();
    };
    const io::Lease before = read();
    io::Lease after = before;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (after.heartbeat_unix_ms == before.heartbeat_unix_ms &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      Result<std::string> text = io::ReadSmallFile(LeasePath(dir), 4096);
      // The lease is replaced by rename: a read sees the old or the new one.
      ASSERT_TRUE(text.ok()) << text.status().ToString();
      after = io::ParseLease(*text).value();
    }
    EXPECT_GT(after.heartbeat_unix_ms, before.heartbeat_unix_ms);
    EXPECT_EQ(after.started_unix_ms, before.started_unix_ms);
    EXPECT_EQ(after.pid, ::getpid());
  }
}

TEST(RootLock, LeaseTimeMustBePositive) {
  Options o;
  o.root_lease_seconds = 0;
  auto opened = OpenAgreed(FreshDir(), o);
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument) << opened.status().ToString();
  EXPECT_THAT(opened.status().message(), HasSubstr("root_lease_seconds"));
  EXPECT_TRUE(SameOnAllRanks(opened.status()));
}

// The second Open waits; rank 0 releases the root only once that Open has
// found it in use (the fault gate `root_busy`, base/fault.h, which makes the
// waiting Open create GATE.reached and wait for GATE), so the test does not
// depend on timing.
TEST(RootLock, WaitsForTheHolderToLeave) {
  const std::string dir = FreshDir();
  const std::string gate = dir + "/gate";
  auto first = OpenForTest(dir);
  ASSERT_TRUE(first);
  ASSERT_TRUE(
      fault::Configure(fmt::format("rank=0,point=root_busy,action=wait,times=1,file={}", gate))
          .ok());
  std::thread release;
  bool reached = false;
  if (Rank() == 0) {
    release = std::thread([&] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!std::filesystem::exists(gate + ".reached") &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling, with a deadline
      }
      reached = std::filesystem::exists(gate + ".reached");
      first.reset();
      std::ofstream(gate) << "go";
    });
  }
  Options o;
  o.root_wait_seconds = 60;
  auto second = OpenAgreed(dir, o);
  if (release.joinable()) release.join();
  const int64_t fired = fault::Fired();
  ASSERT_TRUE(fault::Configure("").ok());
  EXPECT_TRUE(second.ok()) << second.status().ToString();
  if (Rank() == 0) {
    EXPECT_TRUE(reached) << "the second Open never found the root in use";
    EXPECT_EQ(fired, 1);
  }
  first.reset();
}

}  // namespace
}  // namespace mhckpt
