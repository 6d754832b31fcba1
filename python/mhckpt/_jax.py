"""jax.Array leaves: each addressable shard's index is a box.

Saving passes every distinct box this process holds, replicas included (a
fully replicated array is one whole-array box on every process); mhckpt's
plan picks one writer per box. Buffers reach C++ through DLPack, so the one
copy is the C++ snapshot, which completes before ``save`` returns: the arrays
may be donated or deleted right after.

Restoring builds, for the target's sharding, one host buffer per distinct
box of this process, fills them, and assembles a jax.Array with
``jax.make_array_from_single_device_arrays``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

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
        data.block_until_ready()  # the bytes mhckpt copies are the final ones
        a.shards.append((start, count, data))
    return a


def _target_sharding(target: Any):
    sharding = getattr(target, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return sharding


def restore_array(name: str, target: Any, stored: dict) -> RestoreArray:
    shape = tuple(target.shape)
    check_target(name, shape, numpy_dtype_name(name, target.dtype), stored)
    sharding = _target_sharding(target)
    dtype = numpy_dtype(stored["dtype"])
    buffers: Dict[Tuple, np.ndarray] = {}
    placement: List[Tuple[Any, Tuple]] = []
    shards = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
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
