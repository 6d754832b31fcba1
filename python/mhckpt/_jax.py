"""jax.Array leaves: each addressable shard's index is a box.

Saving passes every distinct box this process holds, replicas included (a
fully replicated array is one whole-array box on every process); mhckpt's
plan picks one writer per box. Buffers reach C++ through DLPack, so the one
copy is the C++ snapshot, which completes before ``save`` returns: the arrays
may be donated or deleted right after.

A shard in CUDA device memory is exported with ``__dlpack__(stream=1)``, the
DLPack consumer protocol: XLA makes CUDA's legacy default stream wait (on the
device) for the computation that defines the buffer, and mhckpt, given that
stream as the shard's (0 to the core), copies after it. Neither the host nor
XLA's streams wait. A host buffer (CPU, pinned host memory) is waited for on
the host (``block_until_ready``), as jax's DLPack export without a stream
would do anyway.

Restoring builds, for the target's sharding, one buffer per distinct box of
this process, fills them, and assembles a jax.Array with
``jax.make_array_from_single_device_arrays``. On CUDA devices the buffers are
device arrays (``jnp.empty`` on the shard's device), filled in place through
DLPack on the same stream, so the bytes go from mhckpt's staging memory
straight to the device; a box held by several local devices is filled on the
first and copied to the others. Elsewhere (CPU) they are page-aligned host
arrays, put on their devices with ``jax.device_put``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import jax
import numpy as np

from ._errors import InvalidArgumentError
from ._arrays import (
    RestoreArray,
    SaveArray,
    box_of_slices,
    check_target,
    new_array,
    numpy_dtype,
    numpy_dtype_name,
)

# DLPack's device type of CUDA device memory (kDLCUDA), and its stream number
# for CUDA's legacy default stream (the DLPack Python specification; 0 is not
# allowed there). The core names the legacy default stream 0 (ShardSpec).
_DLPACK_CUDA = 2
_DLPACK_LEGACY_STREAM = 1
_CORE_LEGACY_STREAM = 0


def _cuda_capsule(data: Any) -> Optional[Any]:
    """A DLPack capsule of the single-device array ``data`` whose buffer is in
    CUDA device memory, with the legacy default stream made to wait for the
    buffer's definition; None for any other buffer (host memory, another
    platform) or where the platform cannot take a consumer stream."""
    if data.platform() == "cpu":
        return None
    kind, _ = data.__dlpack_device__()
    if int(kind) != _DLPACK_CUDA:
        return None
    try:
        return data.__dlpack__(stream=_DLPACK_LEGACY_STREAM)
    except jax.errors.JaxRuntimeError as e:
        if "UNIMPLEMENTED" in str(e):
            return None
        raise


def save_array(name: str, x: jax.Array) -> SaveArray:
    if x.is_deleted():
        raise InvalidArgumentError(f"array '{name}': the jax.Array has been deleted")
    a = SaveArray(name, numpy_dtype_name(name, x.dtype), list(x.shape))
    seen = set()
    for shard in x.addressable_shards:
        start, count = box_of_slices(shard.index, x.shape)
        key = (tuple(start), tuple(count))
        if key in seen:  # the same box on several local devices: one copy is enough
            continue
        seen.add(key)
        data = shard.data
        capsule = _cuda_capsule(data)
        if capsule is not None:
            # Ordered on the device: the copy waits for the buffer's
            # definition on the legacy default stream (see the module's
            # docstring). ``x`` (kept by the caller, and by a lazy save until
            # its copy ends) owns the memory the capsule points into.
            a.shards.append((start, count, capsule, _CORE_LEGACY_STREAM))
        else:
            data.block_until_ready()  # the bytes mhckpt copies are the final ones
            a.shards.append((start, count, data))
    return a


def _target_sharding(target: Any):
    sharding = getattr(target, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return sharding


def _on_device(sharding, devices) -> bool:
    """Whether a restore into ``sharding`` may fill device memory: every
    addressable device is an accelerator and the memory is the device's own
    (not pinned host memory). Whether it is CUDA memory is up to DLPack
    (``_device_restore``)."""
    if getattr(sharding, "memory_kind", None) not in (None, "device"):
        return False
    return bool(devices) and all(d.platform != "cpu" for d in devices)


def _device_restore(name: str, shape, sharding, placement, dtype, stored) -> Optional[RestoreArray]:
    """The restore of ``placement`` ((device, (start, count)) per addressable
    device) into new device arrays, or None unless every first buffer of a box
    is CUDA device memory that DLPack exports with a stream."""
    first: Dict[Tuple, Any] = {}  # box -> the device array mhckpt fills
    shards = []
    for device, key in placement:
        if key in first:
            continue
        start, count = key
        buf = jax.numpy.empty(count, dtype=dtype, device=device)
        first[key] = buf
        if buf.size == 0:
            continue
        capsule = _cuda_capsule(buf)
        if capsule is None:
            return None
        # A fresh array nothing else references: mhckpt writes it in place,
        # after its initialisation (the stream waited for it) and before
        # restore returns (the core waits for its copies).
        shards.append((list(start), list(count), capsule, _CORE_LEGACY_STREAM))

    def finish():
        arrays = []
        for device, key in placement:
            buf = first[key]
            arrays.append(buf if device in buf.devices() else jax.device_put(buf, device))
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

    return RestoreArray(name, stored["dtype"], shards, finish)


def restore_array(name: str, target: Any, stored: dict) -> RestoreArray:
    shape = tuple(target.shape)
    check_target(name, shape, numpy_dtype_name(name, target.dtype), stored)
    sharding = _target_sharding(target)
    dtype = numpy_dtype(stored["dtype"])
    indices = sharding.addressable_devices_indices_map(shape)
    if _on_device(sharding, list(indices)):
        placement = []
        for device, index in indices.items():
            start, count = box_of_slices(index, shape)
            placement.append((device, (tuple(start), tuple(count))))
        r = _device_restore(name, shape, sharding, placement, dtype, stored)
        if r is not None:
            return r
    buffers: Dict[Tuple, np.ndarray] = {}
    placement: List[Tuple[Any, Tuple]] = []
    shards = []
    for device, index in indices.items():
        start, count = box_of_slices(index, shape)
        key = (tuple(start), tuple(count))
        if key not in buffers:
            buf = new_array(count, dtype)
            buffers[key] = buf
            if buf.size:
                shards.append((start, count, buf.reshape(-1).view(np.uint8)))
        placement.append((device, key))

    def finish():
        arrays = [jax.device_put(buffers[key], device) for device, key in placement]
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

    return RestoreArray(name, stored["dtype"], shards, finish)
