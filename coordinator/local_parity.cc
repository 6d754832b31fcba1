#include "coordinator/local_parity.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "coordinator/local_tier.h"
#include "io/posix_file.h"

namespace mhckpt::internal {

// ---- The arithmetic ----

namespace {

uint64_t SegmentFor(const std::vector<uint64_t>& member_bytes, size_t members) {
  uint64_t widest = 0;
  for (uint64_t b : member_bytes) widest = std::max(widest, b);
  const auto parts = static_cast<uint64_t>(std::max<size_t>(members, 2) - 1);
  return (widest + parts - 1) / parts;
}

std::vector<uint64_t> MemberBytes(const std::vector<int>& ranks, const WriterFiles& files) {
  std::vector<uint64_t> bytes;
  for (int r : ranks) {
    bytes.push_back(r >= 0 ? files.BytesOf(r) : 0);
  }
  return bytes;
}

}  // namespace

ParityGroup::ParityGroup(std::vector<int> ranks, const WriterFiles& files)
    : ParityGroup(ranks, MemberBytes(ranks, files)) {}

ParityGroup::ParityGroup(std::vector<int> ranks, const std::vector<uint64_t>& member_bytes)
    : members(std::move(ranks)), segment(SegmentFor(member_bytes, members.size())) {}

int ParityGroup::IndexOf(int rank) const {
  auto it = std::find(members.begin(), members.end(), rank);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

void XorInto(std::span<std::byte> acc, std::span<const std::byte> in) {
  for (size_t i = 0; i < in.size(); ++i) acc[i] ^= in[i];
}

void CopySegment(std::span<const std::byte> file, uint64_t k, std::span<std::byte> out) {
  std::fill(out.begin(), out.end(), std::byte{0});
  const uint64_t at = k * out.size();
  if (at < file.size()) {
    std::memcpy(out.data(), file.data() + at, std::min<uint64_t>(out.size(), file.size() - at));
  }
}

std::vector<RebuildInput> RebuildInputs(const ParityGroup& group, int lost, int k) {
  const int bi = group.BlockOf(lost, k);
  std::vector<RebuildInput> inputs{{bi, true, 0}};
  for (int i = 0; i < group.size(); ++i) {
    if (i == lost || i == bi) continue;
    inputs.push_back({i, false, static_cast<uint64_t>(group.SegmentIn(i, bi))});
  }
  return inputs;
}

std::vector<std::vector<std::byte>> EncodeBlocks(
    const ParityGroup& group, const std::vector<std::span<const std::byte>>& files) {
  std::vector<std::vector<std::byte>> blocks(files.size(),
                                             std::vector<std::byte>(group.segment, std::byte{0}));
  std::vector<std::byte> seg(group.segment);
  for (int i = 0; i < group.size(); ++i) {
    for (int k = 0; k + 1 < group.size(); ++k) {
      CopySegment(files[static_cast<size_t>(i)], static_cast<uint64_t>(k), seg);
      XorInto(blocks[static_cast<size_t>(group.BlockOf(i, k))], seg);
    }
  }
  return blocks;
}

std::vector<std::byte> RebuildOnBuffers(const ParityGroup& group, int lost, uint64_t bytes,
                                        const std::vector<std::span<const std::byte>>& files,
                                        const std::vector<std::span<const std::byte>>& blocks) {
  std::vector<std::byte> out(bytes, std::byte{0});
  std::vector<std::byte> acc(group.segment), seg(group.segment);
  for (int k = 0; k + 1 < group.size(); ++k) {
    std::fill(acc.begin(), acc.end(), std::byte{0});
    for (const RebuildInput& in : RebuildInputs(group, lost, k)) {
      const auto m = static_cast<size_t>(in.member);
      CopySegment(in.block ? blocks[m] : files[m], in.segment, seg);
      XorInto(acc, seg);
    }
    const uint64_t at = static_cast<uint64_t>(k) * group.segment;
    if (at < out.size()) {
      std::memcpy(out.data() + at, acc.data(), std::min<uint64_t>(group.segment, out.size() - at));
    }
  }
  return out;
}

// ---- Distributed ----

Status SegmentReader::Read(const std::string& path, uint64_t k, uint64_t seg, std::string* out) {
  out->assign(seg, '\0');
  auto it = mapped_.find(path);
  if (it == mapped_.end()) {
    Result<io::MappedFile> f = io::MappedFile::OpenForReading(path);
    if (!f.ok()) return f.status();
    it = mapped_.emplace(path, std::move(f).value()).first;
  }
  CopySegment({it->second.data(), it->second.size()}, k,
              {reinterpret_cast<std::byte*>(out->data()), out->size()});
  return OkStatus();
}

void GatherRebuild(
    const Comm& comm, const ParityGroup& group, int lost, int rebuilder,
    const std::function<InputAt(const RebuildInput&)>& where,
    const std::function<void(const std::string& path, uint64_t k, std::string* out)>& read, int tag,
    std::span<std::byte> out) {
  const int rank = comm.rank();
  const uint64_t seg = group.segment;
  std::string acc, buf;
  for (int k = 0; k + 1 < group.size(); ++k) {
    if (rank == rebuilder) acc.assign(seg, '\0');
    for (const RebuildInput& input : RebuildInputs(group, lost, k)) {
      const InputAt at = where(input);
      const int source = at.rank;
      if (rank != source && rank != rebuilder) continue;
      if (rank == source) read(at.path, input.segment, &buf);
      if (source != rebuilder) {
        std::vector<MPI_Request> requests;
        if (rank == source) {
          comm.PostSend(buf.data(), seg, rebuilder, tag, &requests);
        } else {
          buf.resize(seg);
          comm.PostReceive(buf.data(), seg, source, tag, &requests);
        }
        Comm::WaitAll(&requests);
      }
      if (rank == rebuilder) {
        XorInto({reinterpret_cast<std::byte*>(acc.data()), acc.size()},
                {reinterpret_cast<const std::byte*>(buf.data()), seg});
      }
    }
    const uint64_t at = static_cast<uint64_t>(k) * seg;
    if (rank == rebuilder && at < out.size()) {
      std::memcpy(out.data() + at, acc.data(), std::min(seg, out.size() - at));
    }
  }
}

const std::vector<int>* FindParityGroup(const std::vector<std::vector<int>>& groups, int w) {
  for (const std::vector<int>& g : groups) {
    if (g.size() >= 2 && std::find(g.begin(), g.end(), w) != g.end()) return &g;
  }
  return nullptr;
}

void RebuildInMemory(const Comm& comm, const LocalPaths& paths, const LocalStep& s,
                     const std::set<int>& writers, const std::function<int(int)>& holder_of,
                     SegmentReader* reader, std::map<int, std::vector<std::byte>>* rebuilt,
                     std::map<int, Status>* errors) {
  const int rank = comm.rank();
  const int64_t step = s.marker.step;
  const WriterFiles files(s.marker);
  // Which ranks hold which blocks whole.
  std::set<int> blocks;
  for (int w : writers) {
    for (int r : *FindParityGroup(s.parity_groups, w)) {
      if (r != w) blocks.insert(r);
    }
  }
  std::vector<int> mine;
  for (int b : blocks) {
    const ParityGroup group(*FindParityGroup(s.parity_groups, b), files);
    Result<uint64_t> size = io::MappedFile::Size(paths.ParityPath(step, b));
    if (size.ok() && *size == group.segment) mine.push_back(b);
  }
  std::map<int, int> block_holder;  // lowest rank
  const std::vector<std::string> all = comm.AllGatherBytes(nlohmann::json(mine).dump());
  for (size_t r = all.size(); r-- > 0;) {
    for (int b : nlohmann::json::parse(all[r]).get<std::vector<int>>()) {
      block_holder[b] = static_cast<int>(r);
    }
  }
  for (int w : writers) {
    const ParityGroup group(*FindParityGroup(s.parity_groups, w), files);
    const int rebuilder = s.holders.at(static_cast<size_t>(w)).front();
    std::vector<std::string> missing;
    for (int r : group.members) {
      if (r != w && !block_holder.count(r)) {
        missing.push_back(fmt::format("rank {}'s parity block", r));
      }
    }
    if (!missing.empty()) {
      (*errors)[w] =
          DataLoss(fmt::format("no node of this job holds {} whole", fmt::join(missing, ", ")));
      continue;
    }
    std::span<std::byte> out;
    if (rank == rebuilder) {
      std::vector<std::byte>& file = (*rebuilt)[w];
      file.assign(files.BytesOf(w), std::byte{0});
      out = file;
    }
    GatherRebuild(
        comm, group, group.IndexOf(w), rebuilder,
        [&](const RebuildInput& in) {
          const int m = group.members[static_cast<size_t>(in.member)];
          if (in.block) return InputAt{paths.ParityPath(step, m), block_holder.at(m)};
          return InputAt{paths.FilePath(step, m), holder_of(m)};
        },
        [&](const std::string& path, uint64_t k, std::string* buf) {
          if (Status read = reader->Read(path, k, group.segment, buf); !read.ok()) {
            Logger()->warn("mhckpt: local step {}: rank {}: parity rebuild: {}", step, rank,
                           read.ToString());
          }
        },
        kParityPieceTag, out);
  }
}

Status RebuildFile(const Comm& comm, const LocalPaths& paths, const LocalStep& s, int lost,
                   int rebuilder, const std::vector<std::vector<int>>& parity_holders) {
  const int rank = comm.rank();
  const WriterFiles files(s.marker);
  const int64_t step = s.marker.step;
  const std::vector<int>* members = FindParityGroup(s.parity_groups, lost);
  if (members == nullptr) return Internal(fmt::format("rank {} has no parity group", lost));
  const ParityGroup group(*members, files);
  Status local;
  io::MappedFile out;
  if (rank == rebuilder) {
    Result<io::MappedFile> f =
        io::MappedFile::Create(paths.FilePath(step, lost), files.BytesOf(lost));
    if (f.ok()) {
      out = std::move(f).value();
    } else {
      local = f.status();
    }
  }
  SegmentReader reader;
  GatherRebuild(
      comm, group, group.IndexOf(lost), rebuilder,
      [&](const RebuildInput& in) {
        const int m = group.members[static_cast<size_t>(in.member)];
        if (in.block) {
          return InputAt{paths.ParityPath(step, m),
                         parity_holders.at(static_cast<size_t>(m)).front()};
        }
        return InputAt{paths.FilePath(step, m), s.holders.at(static_cast<size_t>(m)).front()};
      },
      [&](const std::string& path, uint64_t k, std::string* buf) {
        Status read = reader.Read(path, k, group.segment, buf);
        if (local.ok()) local = read;
      },
      kRebuildTag, {out.data(), out.data() == nullptr ? 0 : out.size()});
  Status closed = out.Close();
  if (local.ok()) local = closed;
  if (rank == rebuilder && local.ok()) {
    Logger()->info("mhckpt: local step {}: rank {}'s boxes rebuilt from parity on rank {}", step,
                   lost, rebuilder);
  }
  if (!local.ok()) {
    local = Status(local.code(), fmt::format("rank {}: rebuilding rank {}'s file of local step "
                                             "{} from parity: {}",
                                             rank, lost, step, local.message()));
  }
  return local;
}

// ---- XorParity: the save ----

namespace {

class ParitySave : public RedundancySave {
 public:
  ParitySave(const LocalPaths& paths, int64_t step, int rank, ParityGroup group)
      : paths_(paths), step_(step), rank_(rank), group_(std::move(group)) {}

  Status Map() {
    if (group_.segment == 0) return OkStatus();
    MHCKPT_ASSIGN_OR_RETURN(
        block_, io::MappedFile::Create(paths_.ParityPath(step_, rank_), group_.segment));
    std::memset(block_.data(), 0, block_.size());  // the XOR of the segments goes into it
    return OkStatus();
  }

  // Segment k of this rank goes to the block of member (i+1+k) mod g; the
  // other members' segments for this rank's block arrive.
  void Post(const Comm& comm, std::span<const std::byte> own,
            std::vector<MPI_Request>* requests) override {
    if (group_.segment == 0) return;
    const int me = group_.IndexOf(rank_);
    const uint64_t seg = group_.segment;
    out_.assign(static_cast<size_t>(group_.size() - 1), std::vector<std::byte>(seg));
    in_.assign(out_.size(), std::vector<std::byte>(seg));
    for (int k = 0; k + 1 < group_.size(); ++k) {
      std::vector<std::byte>& out = out_[static_cast<size_t>(k)];
      CopySegment(own, static_cast<uint64_t>(k), out);
      const int to = group_.members[static_cast<size_t>(group_.BlockOf(me, k))];
      comm.PostSend(out.data(), seg, to, kParityTag, requests);
    }
    for (int i = 0, n = 0; i < group_.size(); ++i) {
      if (i == me) continue;
      comm.PostReceive(in_[static_cast<size_t>(n++)].data(), seg,
                       group_.members[static_cast<size_t>(i)], kParityTag, requests);
    }
  }

  Status Finish() override {
    if (group_.segment == 0) return OkStatus();
    for (const std::vector<std::byte>& in : in_) XorInto({block_.data(), block_.size()}, in);
    MHCKPT_RETURN_IF_ERROR(block_.Close());
    return io::FsyncFile(paths_.ParityPath(step_, rank_));
  }

 private:
  const LocalPaths& paths_;
  const int64_t step_;
  const int rank_;
  const ParityGroup group_;
  io::MappedFile block_;
  std::vector<std::vector<std::byte>> out_, in_;  // segments sent, received
};

class NoSave : public RedundancySave {
 public:
  void Post(const Comm&, std::span<const std::byte>, std::vector<MPI_Request>*) override {}
  Status Finish() override { return OkStatus(); }
};

}  // namespace

void XorParity::AddRewritten(int rank, std::set<std::string>* names) const {
  names->insert(ParityFileName(rank));
}

std::vector<int> XorParity::Unprotected() const {
  std::vector<bool> covered(static_cast<size_t>(nodes_.ranks()), false);
  for (const std::vector<int>& g : groups_) {
    for (int r : g) covered[static_cast<size_t>(r)] = true;
  }
  std::vector<int> out;
  for (int r = 0; r < nodes_.ranks(); ++r) {
    if (!covered[static_cast<size_t>(r)]) out.push_back(r);
  }
  return out;
}

std::vector<int> XorParity::Holders(int w) const { return nodes_.RanksOnNodesOf({w}); }

Result<std::unique_ptr<RedundancySave>> XorParity::BeginSave(int rank, int64_t step,
                                                             const WriterFiles& files) const {
  for (const std::vector<int>& g : groups_) {
    if (std::find(g.begin(), g.end(), rank) == g.end()) continue;
    auto save = std::make_unique<ParitySave>(paths_, step, rank, ParityGroup(g, files));
    MHCKPT_RETURN_IF_ERROR(save->Map());
    return std::unique_ptr<RedundancySave>(std::move(save));
  }
  return std::unique_ptr<RedundancySave>(std::make_unique<NoSave>());
}

}  // namespace mhckpt::internal
