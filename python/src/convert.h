// The map between Python's arguments and the C++ API's types, for
// mhckpt._core (module.cc): the exceptions raised for a Status, the arrays
// of a save or a restore built from (name, dtype, shape, shards) lists with
// no copy of their buffers, the buffers a lazy save holds until its copy has
// ended, and the dicts of timings and step descriptions.
#pragma once

#include <nanobind/nanobind.h>

#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coordinator/checkpoint_manager.h"

namespace mhckpt::python {

namespace nb = nanobind;

// Set by mhckpt/_errors.py: (code name, message) -> exception instance.
nb::object& ErrorFactory();

// Raises the mhckpt exception for the code of `s` (not OK).
[[noreturn]] void Raise(const Status& s);

inline void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Check(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

// Thrown while converting one rank's arguments; becomes that rank's Status,
// which the rest agree on (a rank must not skip the collective call).
struct LocalError {
  std::string message;
};

// SaveOptions::tier by name, as Python passes it ("" is automatic).
SaveTier TierFromName(const std::string& name);

// RestoreOptions::source by name.
RestoreSource SourceFromName(const std::string& name);

// (start, count, buffer object[, stream]) of one box; the buffer is
// converted in C++ so that a bad one is this rank's error, not an exception
// before the collective. `stream`: for device memory, the producer's
// cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream), on
// which the buffer's last writes (save) or pending uses (restore) were
// issued; mhckpt's copies are ordered after that stream's work and the stream
// waits for them. Absent, None or 0: the legacy default stream.
using ShardSpec = nb::tuple;
using SaveSpec = std::tuple<std::string, std::string, std::vector<int64_t>, std::vector<ShardSpec>>;
using RestoreSpec = std::tuple<std::string, std::string, std::vector<ShardSpec>>;
// ("", "") for no error, else (StatusCode name, message) of an error found in Python.
using PyError = std::pair<std::string, std::string>;

// The buffers of a lazy save, held from Save until its copy has ended: the
// Python objects that Save took pointers into, each of which owns its memory
// (a numpy array its data, a tensor its storage, a jax.Array its device
// buffer). A temporary the Python layer made for the call (a contiguous copy
// of a strided array) would otherwise be freed when Save returns, under the
// copy. Not nanobind's views: a DLPack view of a jax.Array is an external
// reference, which would make XLA refuse to donate the array during the copy
// instead of the save failing, as documented (the Python layer's check).
// Release drops them, with the GIL; once the interpreter has gone, it leaks
// them instead.
class HeldBuffers {
 public:
  HeldBuffers() = default;
  HeldBuffers(const HeldBuffers&) = delete;
  HeldBuffers& operator=(const HeldBuffers&) = delete;
  ~HeldBuffers() { Release(); }

  // With the GIL.
  void Add(nb::handle obj) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.push_back(nb::borrow(obj));
  }

  // Any thread, with or without the GIL; once (later calls do nothing).
  void Release() {
    std::vector<nb::object> objects;
    {
      std::lock_guard<std::mutex> lock(mu_);
      objects.swap(objects_);
    }
    if (objects.empty()) return;
    if (Py_IsInitialized() == 0) {
      for (nb::object& o : objects) (void)o.release();  // leaked
      return;
    }
    nb::gil_scoped_acquire gil;
    objects.clear();
  }

 private:
  std::mutex mu_;
  std::vector<nb::object> objects_;
};

// The arrays of a save; `held`, if given, gets every buffer (a lazy save's,
// HeldBuffers). Throws LocalError for a bad spec or buffer.
std::vector<ArrayToSave> ToSave(const std::vector<SaveSpec>& specs, HeldBuffers* held = nullptr);

// The destinations of a restore. Throws LocalError for a bad spec or buffer.
std::vector<ArrayToRestore> ToRestore(const std::vector<RestoreSpec>& specs);

// A StatusCode by the name StatusCodeName gives it (kInternal if unknown).
StatusCode CodeFromName(const std::string& name);

nb::dict TimingsToDict(const SaveTimings& t);
nb::dict DescriptionToDict(const StepDescription& m);

}  // namespace mhckpt::python
