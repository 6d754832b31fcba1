// coordinator/device_broadcast.h without NCCL: restore always broadcasts
// with MPI.
#include "coordinator/device_broadcast.h"

namespace mhckpt::internal {

std::unique_ptr<DeviceBroadcaster> DeviceBroadcaster::Create(const Comm&, int, std::string* why,
                                                             double, Watchdog*) {
  *why = "mhckpt was built without NCCL";
  return nullptr;
}

void SetAgreeBroadcastEnqueueForTest(bool) {}

}  // namespace mhckpt::internal
