// coordinator/local_parity.h: XOR parity of a group on byte buffers — every
// member's file comes back from the others' files and blocks.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "coordinator/local_parity.h"

namespace mhckpt::internal {
namespace {

using Bytes = std::vector<std::byte>;

Bytes Pattern(uint64_t n, int seed) {
  Bytes b(n);
  for (uint64_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 31 + seed * 17 + 5) & 0xff);
  return b;
}

std::vector<std::span<const std::byte>> Spans(const std::vector<Bytes>& v) {
  return {v.begin(), v.end()};
}

// Every member lost in turn, for files of `sizes` bytes.
void CheckEveryMemberRebuilds(const std::vector<uint64_t>& sizes) {
  std::vector<int> ranks;
  std::vector<Bytes> files;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ranks.push_back(static_cast<int>(10 + i));
    files.push_back(Pattern(sizes[i], static_cast<int>(i)));
  }
  const ParityGroup group(ranks, sizes);
  const std::vector<Bytes> blocks = EncodeBlocks(group, Spans(files));
  ASSERT_EQ(blocks.size(), files.size());
  for (const Bytes& b : blocks) EXPECT_EQ(b.size(), group.segment);
  for (int lost = 0; lost < group.size(); ++lost) {
    std::vector<Bytes> damaged = files, damaged_blocks = blocks;
    damaged[static_cast<size_t>(lost)].assign(sizes[static_cast<size_t>(lost)], std::byte{0xee});
    damaged_blocks[static_cast<size_t>(lost)].clear();
    EXPECT_EQ(RebuildOnBuffers(group, lost, sizes[static_cast<size_t>(lost)], Spans(damaged),
                               Spans(damaged_blocks)),
              files[static_cast<size_t>(lost)])
        << "member " << lost << " of " << group.size();
  }
}

TEST(LocalParity, SegmentIsTheLargestFileOverGroupSizeMinusOne) {
  EXPECT_EQ(ParityGroup({0, 1, 2}, std::vector<uint64_t>{10, 3, 0}).segment, 5u);
  EXPECT_EQ(ParityGroup({0, 1, 2, 3}, std::vector<uint64_t>{10, 3, 0, 1}).segment, 4u);
  EXPECT_EQ(ParityGroup({0, 1}, std::vector<uint64_t>{7, 9}).segment, 9u);
}

TEST(LocalParity, EachSegmentGoesToAnotherMembersBlock) {
  const ParityGroup group({5, 6, 7, 8}, std::vector<uint64_t>{12, 12, 12, 12});
  for (int i = 0; i < group.size(); ++i) {
    std::vector<bool> used(static_cast<size_t>(group.size()), false);
    for (int k = 0; k + 1 < group.size(); ++k) {
      const int j = group.BlockOf(i, k);
      EXPECT_NE(j, i);
      EXPECT_FALSE(used[static_cast<size_t>(j)]);
      used[static_cast<size_t>(j)] = true;
      EXPECT_EQ(group.SegmentIn(i, j), k);
    }
  }
  EXPECT_EQ(group.IndexOf(7), 2);
  EXPECT_EQ(group.IndexOf(9), -1);
}

TEST(LocalParity, RebuildInputsAreOneBlockAndTheOtherSegmentsInIt) {
  const ParityGroup group({0, 1, 2, 3}, std::vector<uint64_t>{9, 9, 9, 9});
  for (int k = 0; k < 3; ++k) {
    const std::vector<RebuildInput> in = RebuildInputs(group, 1, k);
    ASSERT_EQ(in.size(), 3u);
    EXPECT_TRUE(in[0].block);
    EXPECT_EQ(in[0].member, group.BlockOf(1, k));
    for (size_t i = 1; i < in.size(); ++i) {
      EXPECT_FALSE(in[i].block);
      EXPECT_NE(in[i].member, 1);
      EXPECT_NE(in[i].member, in[0].member);
      EXPECT_EQ(in[i].segment, static_cast<uint64_t>(group.SegmentIn(in[i].member, in[0].member)));
    }
  }
}

TEST(LocalParity, EveryMemberRebuildsFromTheOthers) {
  CheckEveryMemberRebuilds({8, 8});
  CheckEveryMemberRebuilds({12, 12, 12});
  CheckEveryMemberRebuilds({13, 1, 7, 0});  // unequal, zero-padded; an empty file
  CheckEveryMemberRebuilds({1000, 999, 3, 512, 77});
}

TEST(LocalParity, XorAndSegmentsOnBuffers) {
  Bytes acc{std::byte{0x0f}, std::byte{0xf0}, std::byte{0xaa}};
  const Bytes in{std::byte{0xff}, std::byte{0xff}};
  XorInto(acc, in);
  EXPECT_EQ(acc, (Bytes{std::byte{0xf0}, std::byte{0x0f}, std::byte{0xaa}}));
  const Bytes file = Pattern(5, 1);
  Bytes seg(3);
  CopySegment(file, 1, seg);  // bytes 3, 4 and one zero past the end
  EXPECT_EQ(seg, (Bytes{file[3], file[4], std::byte{0}}));
  CopySegment(file, 2, seg);
  EXPECT_EQ(seg, Bytes(3, std::byte{0}));
}

}  // namespace
}  // namespace mhckpt::internal
