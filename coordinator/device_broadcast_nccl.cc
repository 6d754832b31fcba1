// coordinator/device_broadcast.h with NCCL (found next to the CUDA toolkit).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <set>

#include <fmt/format.h>

#include "coordinator/device_broadcast.h"

namespace mhckpt::internal {
namespace {

// What rank 0 needs to decide: whether this rank can take part, and its GPU.
struct Candidate {
  int usable = 0;
  char uuid[16] = {};
};

class NcclBroadcaster final : public DeviceBroadcaster {
 public:
  NcclBroadcaster(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  ~NcclBroadcaster() override { ncclCommDestroy(comm_); }
  NcclBroadcaster(const NcclBroadcaster&) = delete;
  NcclBroadcaster& operator=(const NcclBroadcaster&) = delete;

  [[nodiscard]] int device() const override { return device_; }

  Status Broadcast(void* data, size_t bytes, int root, void* stream) override {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    auto s = static_cast<cudaStream_t>(stream);
    ncclResult_t r = ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, s);
    cudaError_t e = r == ncclSuccess ? cudaStreamSynchronize(s) : cudaSuccess;
    cudaSetDevice(previous);
    if (r != ncclSuccess) {
      return IoError(fmt::format("NCCL broadcast of {} bytes: {}", bytes, ncclGetErrorString(r)));
    }
    if (e != cudaSuccess) {
      return IoError(fmt::format("NCCL broadcast of {} bytes: {}", bytes, cudaGetErrorString(e)));
    }
    return OkStatus();
  }

 private:
  ncclComm_t comm_;
  int device_;
};

Candidate Probe(int device) {
  Candidate c;
  cudaDeviceProp prop{};
  if (device >= 0 && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    c.usable = 1;
    std::memcpy(c.uuid, &prop.uuid, sizeof(c.uuid));
  }
  return c;
}

// Rank 0: why NCCL cannot serve these ranks, or an empty string.
std::string Refusal(const std::vector<std::string>& gathered) {
  std::set<std::string> gpus;
  for (size_t r = 0; r < gathered.size(); ++r) {
    Candidate c;
    if (gathered[r].size() == sizeof(c)) std::memcpy(&c, gathered[r].data(), sizeof(c));
    if (!c.usable) return fmt::format("rank {} has no usable CUDA device", r);
    if (!gpus.insert(std::string(c.uuid, sizeof(c.uuid))).second) {
      return fmt::format("rank {} shares a GPU with another rank", r);
    }
  }
  return {};
}

}  // namespace

std::unique_ptr<DeviceBroadcaster> DeviceBroadcaster::Create(const Comm& comm, int device,
                                                             std::string* why) {
  Candidate mine = Probe(device);
  std::vector<std::string> all =
      comm.GatherBytes(std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)), 0);
  // Rank 0 decides; its answer (empty: go ahead) and the unique id go to all.
  std::string decision;
  ncclUniqueId id{};
  if (comm.rank() == 0) {
    decision = Refusal(all);
    if (decision.empty() && ncclGetUniqueId(&id) != ncclSuccess)
      decision = "ncclGetUniqueId failed";
    if (decision.empty())
      decision = "+" + std::string(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  comm.BroadcastBytes(&decision, 0);
  if (decision.empty() || decision[0] != '+') {
    *why = decision;
    return nullptr;
  }
  std::memcpy(&id, decision.data() + 1, sizeof(id));
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  ncclComm_t nc = nullptr;
  ncclResult_t r = ncclCommInitRank(&nc, comm.size(), id, comm.rank());
  cudaSetDevice(previous);
  // Every rank must know that every rank's init worked.
  if (comm.AllreduceMax(r == ncclSuccess ? 0 : 1) != 0) {
    if (r == ncclSuccess) ncclCommDestroy(nc);
    *why = "ncclCommInitRank failed on a rank";
    return nullptr;
  }
  return std::make_unique<NcclBroadcaster>(nc, device);
}

}  // namespace mhckpt::internal
