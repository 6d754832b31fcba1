"""Arrays as the C++ core takes them: mhckpt's dtype names, boxes of a global
array, the per-array specs of a save and a restore, and page-aligned host
buffers. Shared by the leaf kinds (``_leaves`` for numpy, ``_jax``,
``_torch``), which import it and not each other."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from . import _core
from ._errors import InvalidArgumentError

# name -> (bytes per element, raw bits): the core's dtype table (base/dtype.h).
_TABLE: Dict[str, Tuple[int, bool]] = _core.dtypes()
DTYPES = frozenset(_TABLE)

Box = Tuple[List[int], List[int]]  # (start, count)


@dataclass
class SaveArray:
    """One array as ``_core.Manager.save`` takes it."""

    name: str
    dtype: str
    shape: List[int]
    # (start, count, buffer[, stream]): stream, a device buffer's cudaStream_t as an int
    shards: List[Tuple[Any, ...]] = field(default_factory=list)

    def spec(self):
        return (self.name, self.dtype, self.shape, self.shards)


@dataclass
class RestoreArray:
    """One array as ``_core.Manager.restore`` takes it, and how to finish the
    leaf once its buffers are filled."""

    name: str
    dtype: str
    shards: List[Tuple[Any, ...]]  # (start, count, buffer[, stream]), as in SaveArray
    finish: Callable[[], Any]

    def spec(self):
        return (self.name, self.dtype, self.shards)


# np.dtype -> its mhckpt name. dtype.name is computed in Python by numpy (about
# 1 us, a third of a leaf's cost in save()); a state has a handful of dtypes.
_DTYPE_NAMES: Dict[np.dtype, str] = {}


def numpy_dtype_name(name: str, dtype: Any) -> str:
    """The mhckpt name of a numpy dtype, or InvalidArgumentError naming the key."""
    d = np.dtype(dtype)
    n = _DTYPE_NAMES.get(d)
    if n is None:
        if not d.isnative:  # its name is the native one's; its bytes are not
            raise InvalidArgumentError(
                f"array '{name}': dtype {d.str} is not in this machine's byte order "
                f"(convert it with .astype({d.name!r}))"
            )
        n = d.name
        if n not in DTYPES:
            raise InvalidArgumentError(
                f"array '{name}': dtype {n} is not supported (supported: {', '.join(sorted(DTYPES))})"
            )
        _DTYPE_NAMES[d] = n
    return n


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of an mhckpt dtype name (the raw-bits ones, bfloat16 and
    float8, via ml_dtypes)."""
    if _TABLE[name][1]:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def host_bytes(a: np.ndarray) -> np.ndarray:
    """A flat uint8 view of ``a`` for the C++ core: no copy when ``a`` is
    C-contiguous (a non-contiguous array is copied once, here)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def box_of_slices(index: Sequence[slice], shape: Sequence[int]) -> Box:
    """(start, count) of a tuple of slices into ``shape`` (step 1 only)."""
    start, count = [], []
    for sl, n in zip(index, shape):
        b, e, step = sl.indices(n)
        if step != 1:
            raise InvalidArgumentError(f"a shard index with step {step} is not a box")
        start.append(b)
        count.append(max(e - b, 0))
    return start, count


def check_target(name: str, shape, dtype: str, stored: dict) -> None:
    """A restore target must have the stored global shape and dtype."""
    if list(shape) != list(stored["shape"]):
        raise InvalidArgumentError(
            f"array '{name}': the target's shape {tuple(shape)} is not the stored shape "
            f"{tuple(stored['shape'])}"
        )
    if dtype != stored["dtype"]:
        raise InvalidArgumentError(
            f"array '{name}': the target's dtype {dtype} is not the stored dtype {stored['dtype']}"
        )


_PAGE = 4096


def new_array(shape, dtype) -> np.ndarray:
    """A new, untouched C-contiguous array whose data starts on a page
    boundary, so that a restore into it reads straight from the disk where
    its rows line up with the file (``direct_reads``). numpy advises the
    allocation under it as any new array (huge pages from 4 MiB)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _PAGE, dtype=np.uint8)
    skip = -raw.ctypes.data % _PAGE
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)
