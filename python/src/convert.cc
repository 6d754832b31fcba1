// The map between Python's arguments and the C++ API's types (convert.h).
#include "convert.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace mhckpt::python {

nb::object& ErrorFactory() {
  static nb::object* factory = new nb::object();  // never destroyed: outlives the interpreter
  return *factory;
}

void Raise(const Status& s) {
  nb::object exc;
  if (ErrorFactory().is_valid()) exc = ErrorFactory()(StatusCodeName(s.code()), s.message());
  if (!exc.is_valid()) throw std::runtime_error(s.ToString());
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

SaveTier TierFromName(const std::string& name) {
  if (name.empty()) return SaveTier::kAuto;
  if (name == "local") return SaveTier::kLocal;
  if (name == "persistent") return SaveTier::kPersistent;
  throw LocalError{"tier '" + name + "' is not None, 'local' or 'persistent'"};
}

RestoreSource SourceFromName(const std::string& name) {
  if (name == "any") return RestoreSource::kAny;
  if (name == "local") return RestoreSource::kLocal;
  if (name == "persistent") return RestoreSource::kPersistent;
  throw LocalError{"source '" + name + "' is not 'any', 'local' or 'persistent'"};
}

namespace {

DType ParseDType(const std::string& name, const std::string& array) {
  std::optional<DType> d = DTypeFromName(name);
  if (!d) throw LocalError{"array '" + array + "': unknown dtype '" + name + "'"};
  return *d;
}

// A buffer as mhckpt sees it: a pointer, its memory kind and, for device
// memory, its CUDA device. Takes any object with the buffer protocol or
// DLPack, without a copy; refuses what the C++ core cannot take as one
// row-major run of `count` elements of `dtype`. The order with the
// producer's work comes from the stream each shard names (ShardSpec): the
// Python layer passes a DLPack capsule it exported for that stream (a
// jax.Array), or an object whose __dlpack__() nanobind calls without one (a
// torch tensor: no wait; a jax.Array: the host waits for the buffer).
struct PyBuffer {
  void* data;
  Memory memory;
  int device;
};

template <typename Array>
PyBuffer Buffer(nb::handle obj, const std::vector<int64_t>& count, DType dtype,
                const std::string& what) {
  Array a;
  if (!nb::try_cast(obj, a)) {
    throw LocalError{what + ": " + nb::type_name(obj.type()).c_str() +
                     " is not a buffer (buffer protocol or DLPack)" +
                     (std::is_same_v<Array, nb::ndarray<>> ? " or is read-only" : "")};
  }
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expect) throw LocalError{what + ": not C-contiguous"};
    expect *= static_cast<int64_t>(a.shape(i));
  }
  std::optional<int64_t> volume = Volume(count);
  if (!volume) throw LocalError{what + ": invalid box extents"};
  size_t need = static_cast<size_t>(*volume) * DTypeSize(dtype);
  if (a.nbytes() != need) {
    throw LocalError{what + ": the buffer holds " + std::to_string(a.nbytes()) +
                     " bytes, the box " + ShapeToString(count) + " of " +
                     std::string(DTypeName(dtype)) + " needs " + std::to_string(need)};
  }
  Memory memory;
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: memory = Memory::kHost; break;
    case nb::device::cuda::value: memory = Memory::kCuda; break;
    default:
      throw LocalError{what + ": the buffer is on a device mhckpt does not support (DLPack " +
                       "device type " + std::to_string(a.device_type()) + ")"};
  }
  // The caller's Python objects (in `specs`) keep the memory alive for the
  // call (and a lazy save's HeldBuffers until its copy ends).
  return {const_cast<void*>(static_cast<const void*>(a.data())), memory,
          memory == Memory::kCuda ? static_cast<int>(a.device_id()) : -1};
}

std::string BoxWhat(const std::string& name, const std::vector<int64_t>& start,
                    const std::vector<int64_t>& count) {
  return "array '" + name + "' box " + BoxToString({start, count});
}

struct ParsedShard {
  Box box;
  nb::handle obj;
  void* stream = nullptr;
};

ParsedShard ParseShard(const ShardSpec& spec, const std::string& name) {
  ParsedShard p;
  if ((spec.size() != 3 && spec.size() != 4) || !nb::try_cast(spec[0], p.box.start) ||
      !nb::try_cast(spec[1], p.box.count)) {
    throw LocalError{"array '" + name + "': a shard is (start, count, buffer[, stream])"};
  }
  p.obj = spec[2];
  uintptr_t stream = 0;
  if (spec.size() == 4 && !spec[3].is_none() && !nb::try_cast(spec[3], stream)) {
    throw LocalError{"array '" + name + "': a shard's stream is an integer cudaStream_t or None"};
  }
  // A cudaStream_t that Python holds as an integer.
  p.stream = reinterpret_cast<void*>(stream);  // NOLINT(performance-no-int-to-ptr)
  return p;
}

}  // namespace

std::vector<ArrayToSave> ToSave(const std::vector<SaveSpec>& specs, HeldBuffers* held) {
  std::vector<ArrayToSave> arrays;
  arrays.reserve(specs.size());
  for (const auto& [name, dtype, shape, shards] : specs) {
    ArrayToSave a{name, ParseDType(dtype, name), shape, {}};
    for (const ShardSpec& spec : shards) {
      ParsedShard p = ParseShard(spec, name);
      PyBuffer b = Buffer<nb::ndarray<nb::ro>>(p.obj, p.box.count, a.dtype,
                                               BoxWhat(name, p.box.start, p.box.count));
      if (held != nullptr) held->Add(p.obj);
      a.shards.push_back(
          Shard{p.box, b.data, b.memory, b.device, b.memory == Memory::kCuda ? p.stream : nullptr});
    }
    arrays.push_back(std::move(a));
  }
  return arrays;
}

std::vector<ArrayToRestore> ToRestore(const std::vector<RestoreSpec>& specs) {
  std::vector<ArrayToRestore> arrays;
  arrays.reserve(specs.size());
  for (const auto& [name, dtype, shards] : specs) {
    ArrayToRestore a{name, ParseDType(dtype, name), {}};
    for (const ShardSpec& spec : shards) {
      ParsedShard p = ParseShard(spec, name);
      PyBuffer b = Buffer<nb::ndarray<>>(p.obj, p.box.count, a.dtype,
                                         BoxWhat(name, p.box.start, p.box.count));
      a.shards.push_back(Destination{p.box, b.data, b.memory, b.device,
                                     b.memory == Memory::kCuda ? p.stream : nullptr});
    }
    arrays.push_back(std::move(a));
  }
  return arrays;
}

StatusCode CodeFromName(const std::string& name) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (name == StatusCodeName(static_cast<StatusCode>(c))) return static_cast<StatusCode>(c);
  }
  return StatusCode::kInternal;
}

nb::dict TimingsToDict(const SaveTimings& t) {
  nb::dict d;
  d["budget_wait"] = t.budget_wait;
  d["snapshot"] = t.snapshot;
  d["plan"] = t.plan;
  d["write"] = t.write;
  d["flush"] = t.flush;
  d["commit"] = t.commit;
  d["gc"] = t.gc;
  d["plan_cached"] = t.plan_cached;
  d["local_bytes"] = t.local_bytes;
  d["written_bytes"] = t.written_bytes;
  return d;
}

nb::dict DescriptionToDict(const StepDescription& m) {
  nb::list arrays;
  for (const StoredArray& a : m.arrays) {
    nb::list boxes;
    for (const StoredBox& b : a.boxes) {
      nb::dict box;
      box["start"] = b.box.start;
      box["count"] = b.box.count;
      box["writer"] = b.writer;
      box["checksum"] = b.checksum;
      boxes.append(box);
    }
    nb::dict d;
    d["name"] = a.name;
    d["dtype"] = std::string(DTypeName(a.dtype));
    d["shape"] = a.shape;
    d["replicated"] = a.replicated;
    d["boxes"] = boxes;
    arrays.append(d);
  }
  nb::dict d;
  d["format_version"] = m.format_version;
  d["files"] = m.files;
  d["step"] = m.step;
  d["world_size"] = m.world_size;
  d["created_unix_ms"] = m.created_unix_ms;
  d["total_bytes"] = m.total_bytes;
  d["arrays"] = arrays;
  d["user_metadata"] = m.user_metadata;
  if (m.preemption) {
    nb::dict p;
    p["notice_unix_ms"] = m.preemption->notice_unix_ms;
    p["grace_seconds"] = m.preemption->grace_seconds;
    p["saved_after_seconds"] = m.preemption->saved_after_seconds;
    d["preemption"] = p;
  } else {
    d["preemption"] = nb::none();
  }
  return d;
}

}  // namespace mhckpt::python
