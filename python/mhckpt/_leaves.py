"""Leaves of a state pytree, mapped to mhckpt arrays and boxes, and back.

A leaf is one of
  - an array: numpy (replicated), ``mhckpt.Shard`` (a numpy box of a global
    array), ``jax.Array`` (mhckpt/_jax.py), ``torch.Tensor`` / ``DTensor``
    (mhckpt/_torch.py);
  - a value: ``None``, ``bool``, ``int``, ``float``, ``str``. Values are taken
    from rank 0 and stored as JSON in the same commit marker as the arrays.

This module knows numpy; jax and torch are imported only when a leaf of
theirs shows up (``sys.modules`` is checked first, so neither is imported
here). The array specs, dtype names and boxes the kinds share are in
mhckpt/_arrays.py.
"""
from __future__ import annotations

import sys
from typing import Any, List

import numpy as np

from . import _core
from ._arrays import (  # noqa: F401 (DTYPES, Box: re-exported)
    DTYPES,
    Box,
    RestoreArray,
    SaveArray,
    box_of_slices,
    check_target,
    host_bytes,
    new_array,
    numpy_dtype,
    numpy_dtype_name,
)
from ._errors import InvalidArgumentError, NotFoundError
from ._shard import Shard

VALUE_TYPES = (type(None), bool, int, float, str)


def is_leaf(x: Any) -> bool:
    """Stops the pytree walk at leaves that are containers to jax/builtins."""
    return x is None or isinstance(x, Shard)


def is_value(x: Any) -> bool:
    # Exactly these types: a subclass (np.float64, an IntEnum, a str
    # subclass) would come back from JSON as its base type.
    return type(x) in VALUE_TYPES


def is_utf8(s: str) -> bool:
    """Whether ``s`` can be passed to C++ (no lone surrogates)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_array_name(name: str) -> None:
    """InvalidArgumentError unless the core takes ``name`` for an array: a
    '/'-separated path of non-empty components, none '.' or '..', printable
    ASCII (base/types.h). Checked here, at ``save``, rather than by the core
    after the save has started. (Values -- None, bool, int, float, str
    leaves -- are stored as JSON, under any name.)"""
    why = _core.check_array_name(name) if is_utf8(name) else "the name is not valid UTF-8"
    if why:
        raise InvalidArgumentError(
            f"array {name!r}: {why}; an array's name is its key path joined with '/', "
            "so its keys must be non-empty printable ASCII without '/' and not '.' or '..'"
        )


def _module_of(x: Any) -> str:
    return type(x).__module__.split(".", 1)[0]


def is_jax_array(x: Any) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def is_jax_struct(x: Any) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.ShapeDtypeStruct)


def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


# ---------------------------------------------------------------- save side


def save_array(name: str, leaf: Any) -> SaveArray:
    """The array (name, dtype, global shape, this rank's boxes) of one leaf."""
    if isinstance(leaf, Shard):
        local = np.asarray(leaf.local)
        if local.ndim != len(leaf.offset) or local.ndim != len(leaf.global_shape):
            raise InvalidArgumentError(
                f"array '{name}': Shard has a {local.ndim}-d block, offset {leaf.offset} and "
                f"global shape {leaf.global_shape}: the three must have the same rank"
            )
        a = SaveArray(name, numpy_dtype_name(name, local.dtype), list(leaf.global_shape))
        if local.size:  # an empty block: this rank holds no box of the array
            a.shards.append((list(leaf.offset), list(local.shape), host_bytes(local)))
        return a
    if isinstance(leaf, (np.ndarray, np.generic)):
        arr = np.asarray(leaf)
        a = SaveArray(name, numpy_dtype_name(name, arr.dtype), list(arr.shape))
        a.shards.append(([0] * arr.ndim, list(arr.shape), host_bytes(arr)))
        return a
    if is_jax_array(leaf):
        from . import _jax

        return _jax.save_array(name, leaf)
    if is_torch_tensor(leaf):
        from . import _torch

        return _torch.save_array(name, leaf)
    raise InvalidArgumentError(
        f"leaf '{name}': {type(leaf).__module__}.{type(leaf).__qualname__} is neither an array "
        "(numpy, mhckpt.Shard, jax.Array, torch.Tensor) nor a value (None, bool, int, float, str; "
        "not a subclass of one, which would be restored as the base type)"
    )


# ------------------------------------------------------------- restore side


def restore_array(name: str, target: Any, stored: dict) -> RestoreArray:
    """How to fill the leaf ``target`` from the stored array ``stored``."""
    if isinstance(target, Shard):
        local = target.local
        if not isinstance(local, np.ndarray):
            raise InvalidArgumentError(f"array '{name}': a Shard target needs a numpy block")
        if list(target.global_shape) != list(stored["shape"]):
            raise InvalidArgumentError(
                f"array '{name}': the target's global shape {target.global_shape} is not the "
                f"stored shape {tuple(stored['shape'])}"
            )
        check_target(name, stored["shape"], numpy_dtype_name(name, local.dtype), stored)
        return numpy_into(name, stored["dtype"], local, list(target.offset), lambda: target)
    if isinstance(target, np.ndarray):
        check_target(name, target.shape, numpy_dtype_name(name, target.dtype), stored)
        return numpy_into(name, stored["dtype"], target, [0] * target.ndim, lambda: target)
    if is_jax_array(target) or is_jax_struct(target):
        from . import _jax

        return _jax.restore_array(name, target, stored)
    if is_torch_tensor(target):
        from . import _torch

        return _torch.restore_array(name, target, stored)
    # Anything else (None, a value) gets a new numpy array; a numpy scalar,
    # a new numpy scalar of its type.
    out = new_array(stored["shape"], numpy_dtype(stored["dtype"]))
    if isinstance(target, np.generic):
        check_target(name, (), numpy_dtype_name(name, target.dtype), stored)
        return numpy_into(name, stored["dtype"], out, [], lambda: out[()])
    return numpy_into(name, stored["dtype"], out, [0] * out.ndim, lambda: out)


def numpy_into(name: str, dtype: str, dest: np.ndarray, start: List[int], result) -> RestoreArray:
    """Fills ``dest`` (the box at ``start``) in place; through a temporary when
    ``dest`` is not writable C-contiguous memory."""
    if dest.flags.c_contiguous and dest.flags.writeable:
        buf, fin = dest, result
    else:
        if not dest.flags.writeable:
            raise InvalidArgumentError(f"array '{name}': the target array is read-only")
        buf = new_array(dest.shape, dest.dtype)

        def fin():
            dest[...] = buf
            return result()

    shards = [(start, list(dest.shape), buf.reshape(-1).view(np.uint8))] if buf.size else []
    return RestoreArray(name, dtype, shards, fin)


def local_bytes(leaf: Any) -> int:
    """The bytes this process stages when it saves ``leaf`` (for
    ``CheckpointManager.reserve``): each distinct box it holds, once. A
    ``jax.ShapeDtypeStruct`` with a sharding (``jax.eval_shape``) counts as
    the array it describes; values and leaves of unknown kinds count 0."""
    if leaf is None or is_value(leaf):
        return 0
    if isinstance(leaf, Shard):
        return int(np.asarray(leaf.local).nbytes)
    if is_jax_array(leaf) or is_jax_struct(leaf):
        item = np.dtype(leaf.dtype).itemsize
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            return int(np.prod(leaf.shape, dtype=np.int64)) * item
        boxes = {tuple(box_of_slices(index, leaf.shape)[0] + box_of_slices(index, leaf.shape)[1])
                 for index in sharding.addressable_devices_indices_map(tuple(leaf.shape)).values()}
        n = len(leaf.shape)
        return sum(int(np.prod(b[n:], dtype=np.int64)) * item for b in boxes)
    if is_torch_tensor(leaf):
        local = leaf.to_local() if hasattr(leaf, "to_local") else leaf
        return int(local.numel()) * int(local.element_size())
    if hasattr(leaf, "nbytes"):
        return int(leaf.nbytes)
    return 0


def not_found(name: str, step: int) -> NotFoundError:
    return NotFoundError(f"step {step} has no array or value '{name}'")

