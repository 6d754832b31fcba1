"""torch.Tensor and DTensor leaves.

A plain tensor is replicated: every rank holds the whole array. A DTensor's
placements on its DeviceMesh give this rank's box (Shard(d) and Replicate;
uneven shards as torch.chunk makes them). Partial placements hold no box and
are refused: redistribute them first. Buffers reach C++ through DLPack (a
detached view: no copy), device tensors as device memory.

Device tensors are ordered with the current stream of their device
(``torch.cuda.current_stream(device)``, the stream the training code issues
on, also under ``with torch.cuda.stream(s):``): a save copies after the work
queued there so far, and a restore starts after it and makes that stream
wait for the restored bytes. Both return with the copies complete.

Restoring fills the target in place (the DTensor's local tensor), and returns
the target itself.
"""
from __future__ import annotations

from typing import Any, List, Tuple

import torch

from ._errors import InvalidArgumentError
from ._arrays import DTYPES, RestoreArray, SaveArray, check_target


def dtype_name(name: str, dtype: torch.dtype) -> str:
    n = str(dtype).removeprefix("torch.")
    if n not in DTYPES:
        raise InvalidArgumentError(f"array '{name}': dtype {dtype} is not supported")
    return n


def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.4
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    return DTensor


def is_dtensor(t: Any) -> bool:
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


def dtensor_box(name: str, t) -> Tuple[List[int], List[int]]:
    """(start, count) of this rank's local tensor in the DTensor's global shape."""
    for p in t.placements:
        kind = type(p).__name__
        if kind not in ("Shard", "Replicate"):
            raise InvalidArgumentError(
                f"array '{name}': DTensor placement {p} holds no box of the global array; "
                "redistribute it to Shard or Replicate placements first"
            )
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    count, start = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    local = t.to_local()
    if tuple(local.shape) != tuple(count):
        raise InvalidArgumentError(
            f"array '{name}': the local tensor has shape {tuple(local.shape)}, its placements "
            f"{t.placements} give {tuple(count)}"
        )
    return list(start), list(count)


def _as_buffer(t: torch.Tensor) -> torch.Tensor:
    """A flat byte view of ``t`` for DLPack: no copy when contiguous."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def stream_of(t: torch.Tensor) -> int:
    """The producer's stream of ``t`` as an integer ``cudaStream_t`` (0 for a
    host tensor): the current stream of its device."""
    if t.device.type != "cuda":
        return 0
    return int(torch.cuda.current_stream(t.device).cuda_stream)


def save_array(name: str, t: torch.Tensor) -> SaveArray:
    dt = dtype_name(name, t.dtype)
    if is_dtensor(t):
        start, count = dtensor_box(name, t)
        local = t.to_local()
    else:
        start, count, local = [0] * t.dim(), list(t.shape), t
    a = SaveArray(name, dt, list(t.shape))
    if local.numel():
        a.shards.append((start, count, _as_buffer(local), stream_of(local)))
    return a


def restore_array(name: str, target: torch.Tensor, stored: dict) -> RestoreArray:
    check_target(name, tuple(target.shape), dtype_name(name, target.dtype), stored)
    if is_dtensor(target):
        start, count = dtensor_box(name, target)
        local = target.to_local()
    else:
        start, count, local = [0] * target.dim(), list(target.shape), target
    local = local.detach()
    if local.is_contiguous():
        buf, fin = local, (lambda: target)
    else:
        buf = torch.empty_like(local, memory_format=torch.contiguous_format)

        def fin():
            with torch.no_grad():
                local.copy_(buf)
            return target

    view = buf.reshape(-1).view(torch.uint8)
    shards = [(start, count, view, stream_of(buf))] if buf.numel() else []
    return RestoreArray(name, stored["dtype"], shards, fin)
