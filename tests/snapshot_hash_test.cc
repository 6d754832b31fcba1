// worker/snapshot.h: a host box copied with SnapshotCopy::hash_chunk_bytes
// is hashed on the way; its staged sums are those of its bytes, whole and
// in chunks, guarded or not, in one chunk or several.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "base/checksum.h"
#include "worker/snapshot.h"
#include "worker/staging_pool.h"

namespace mhckpt::internal {
namespace {

struct Case {
  size_t rows;         // rows of 4 KiB
  size_t chunk_bytes;  // hash_chunk_bytes
  bool guarded;
};

class SnapshotHashTest : public ::testing::TestWithParam<Case> {};

TEST_P(SnapshotHashTest, StagedSumsAreThoseOfTheBytes) {
  const Case c = GetParam();
  std::vector<uint8_t> data(c.rows * 4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 11);
  std::vector<ArrayToSave> arrays(1);
  arrays[0].name = "w";
  arrays[0].dtype = DType::kUInt8;
  arrays[0].shape = {static_cast<int64_t>(c.rows), 4096};
  arrays[0].shards.push_back({Box{{0, 0}, {static_cast<int64_t>(c.rows), 4096}}, data.data()});
  SnapshotOptions so;
  so.guarded = c.guarded;
  StagingPool pool;
  Snapshot snapshot;
  std::vector<SnapshotCopy> copies;
  ASSERT_TRUE(PrepareSnapshot(arrays, so, &snapshot, &copies).ok());
  ASSERT_EQ(copies.size(), 1u);
  copies[0].hash_chunk_bytes = c.chunk_bytes;
  ASSERT_TRUE(AcquireStaging(so, pool, &snapshot).ok());
  ASSERT_TRUE(CopyIntoSnapshot(copies, so, OkStatus(), &snapshot).ok());

  const StagedBox& box = snapshot.arrays.at(0).boxes.at(0);
  ASSERT_EQ(box.size, data.size());
  EXPECT_EQ(std::memcmp(snapshot.data(box), data.data(), data.size()), 0);
  std::vector<uint64_t> chunks;
  const uint64_t whole = ChecksumChunks(data.data(), data.size(), c.chunk_bytes, &chunks);
  EXPECT_EQ(box.sum, whole);
  EXPECT_EQ(box.sum, Checksum(data.data(), data.size()));
  EXPECT_EQ(box.chunks, chunks);
  EXPECT_EQ(box.hashed_chunk_bytes, c.chunk_bytes);
}

INSTANTIATE_TEST_SUITE_P(Boxes, SnapshotHashTest,
                         ::testing::Values(Case{1, 1 << 20, false},   // one chunk, under a piece
                                           Case{300, 4 << 20, true},  // one chunk, several pieces
                                           Case{300, 300 << 10, false},  // chunks that cut pieces
                                           Case{1000, 1 << 20, true},    // many chunks, guarded
                                           Case{1000, (1 << 20) + 8,
                                                false}));  // chunks off the pages

}  // namespace
}  // namespace mhckpt::internal
