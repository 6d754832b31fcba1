"""Helpers shared by the mhckpt pytest suite (python/tests).

Every rank of the mpirun job runs the same tests in the same order. A check
that could pass on one rank and fail on another goes through :func:`all_ok`
(an allgather), so that every rank fails together and the next test starts
on every rank at the same collective call, instead of one rank moving on
while the others wait in a collective of the failed test.

Test data is a deterministic function of (array name, global index), so a job
of any world size knows the bytes of every box, including a job that restores
what a job of another size saved.
"""
from __future__ import annotations

import os
import socket
import zlib
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type

import numpy as np

import mhckpt

ALL_DTYPES = (
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 bfloat16 float32 "
    "float64 float8_e4m3fn float8_e5m2"
).split()


def np_dtype(name: str) -> np.dtype:
    """numpy dtype of an mhckpt dtype name (bfloat16/float8 from ml_dtypes)."""
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def pattern(name: str, shape: Sequence[int], dtype: str = "float32") -> np.ndarray:
    """The global array of test data named ``name``: a deterministic function
    of the name and each element's global index (a generator seeded by the
    name's CRC, drawn in row-major order). Values are exact in ``dtype`` (no
    NaN, no rounding), so any conversion that keeps values keeps bytes."""
    shape = tuple(int(s) for s in shape)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    k = rng.integers(0, 2**64, size=shape, dtype=np.uint64)
    dt = np_dtype(dtype)
    if dtype == "bool":
        return (k & 1).astype(bool)
    if dt.kind in "iu":
        return k.astype(dt)  # wraps: every byte varies, sign bits included
    if dtype in ("float8_e4m3fn", "float8_e5m2"):
        return (((k % 15).astype(np.float32) - 7) * 0.5).astype(dt)  # -3.5 .. 3.5
    if dtype in ("float16", "bfloat16"):
        return (((k % 255).astype(np.float32) - 127) / 4).astype(dt)  # 7 mantissa bits
    return (((k % 2**20).astype(np.float64) - 2**19) / 64).astype(dt)


def block(n: int, rank: int, size: int) -> Tuple[int, int]:
    """(start, count) of ``rank``'s rows when ``n`` rows are split among
    ``size`` ranks as ``np.array_split`` does (uneven: the first get more)."""
    base, extra = divmod(n, size)
    count = base + (1 if rank < extra else 0)
    start = rank * base + min(rank, extra)
    return start, count


def torch_local(t) -> np.ndarray:
    """The elements a tensor (a DTensor: its local tensor) holds, as numpy."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bytes, viewed
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def torch_tensor(a: np.ndarray):
    """A new torch tensor with the elements of numpy ``a`` (bfloat16 too)."""
    import torch

    a = np.ascontiguousarray(a).copy()
    if a.dtype == np_dtype("bfloat16"):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def dtensor_slice(td, global_np: np.ndarray, placement, rank: Optional[int] = None) -> np.ndarray:
    """The part of ``global_np`` that a DTensor with the one ``placement`` on
    ``td``'s 1-d mesh holds on ``rank``: torch.chunk's split for Shard(d)
    (chunks of ceil(n / size), the last ones shorter or empty), all of it
    for Replicate."""
    from torch.distributed.tensor import Shard

    rank = td.rank if rank is None else rank
    if not isinstance(placement, Shard):
        return global_np
    n = global_np.shape[placement.dim]
    chunk = -(-n // td.size)
    index = [slice(None)] * global_np.ndim
    index[placement.dim] = slice(min(rank * chunk, n), min((rank + 1) * chunk, n))
    return global_np[tuple(index)]


def as_bytes(a: Any) -> bytes:
    """The raw bytes of a numpy array (any layout), row-major."""
    return np.ascontiguousarray(a).tobytes()


def all_ok(comm, ok: bool, what: str) -> None:
    """Collective assert: raises AssertionError on every rank unless ``ok``
    holds on every rank, naming the failing ranks and ``what``."""
    oks = comm.allgather(bool(ok))
    bad = [r for r, o in enumerate(oks) if not o]
    assert not bad, f"{what}: fails on rank(s) {bad}"


def all_equal_bytes(comm, got: Any, want: Any, what: str) -> None:
    """Collective: ``got`` has ``want``'s shape, dtype and bytes on every rank."""
    got = np.asarray(got)
    want = np.asarray(want)
    ok = got.shape == want.shape and got.dtype == want.dtype and as_bytes(got) == as_bytes(want)
    detail = "" if ok else f" (got {got.dtype}{got.shape}, want {want.dtype}{want.shape})"
    all_ok(comm, ok, what + detail)


def raises_everywhere(
    comm,
    exc_type: Type[BaseException],
    fn: Callable[[], Any],
    *,
    contains: Sequence[str] = (),
) -> str:
    """Runs ``fn`` on every rank; it must raise ``exc_type`` on every rank, with
    the same message everywhere (the errors are agreed), containing each of
    ``contains``. Returns the message."""
    try:
        fn()
        got: Tuple[Optional[str], str] = (None, "no exception")
    except Exception as e:  # compared across ranks below
        got = (type(e).__name__, str(e))
    everyone: List[Tuple[Optional[str], str]] = comm.allgather(got)
    names = {n for n, _ in everyone}
    messages = {m for _, m in everyone}
    assert names == {exc_type.__name__}, f"expected {exc_type.__name__} everywhere, got {everyone}"
    assert len(messages) == 1, f"the ranks raised different messages: {everyone}"
    message = everyone[0][1]
    for part in contains:
        assert part in message, f"{part!r} is not in the message {message!r}"
    return message


def step_data_file(root: str, step: int) -> str:
    """The HDF5 file of a step (docs/FORMAT.md: ROOT/step_%010d/data.h5)."""
    return os.path.join(root, f"step_{step:010d}", "data.h5")


def flip_byte_of(path: str, data: bytes) -> int:
    """Flips one byte in the middle of ``data``'s copy inside the file at
    ``path`` (found by its bytes: the dataset is stored contiguously), makes
    it durable, and returns the file offset it changed."""
    with open(path, "r+b") as f:
        content = f.read()
        mid = len(data) // 2
        probe = data[mid - 32 : mid + 32]
        at = content.find(probe)
        assert at >= 0, f"the array's bytes are not in {path}"
        assert content.find(probe, at + 1) < 0, "the probe is not unique in the file"
        at += 32
        f.seek(at)
        f.write(bytes([content[at] ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())
    return at


def open_node_local(root: str, comm, **kw) -> "mhckpt.CheckpointManager":
    """A manager of ROOT/shared with a local tier: each rank is its own node
    (node_id = rank) with its own local dir, ROOT/node<rank>."""
    return mhckpt.CheckpointManager(
        os.path.join(root, "shared"), local_dir=os.path.join(root, f"node{comm.rank}"),
        node_id=comm.rank, collective_timeout_seconds=120, **kw)


def tier_state(step: int, comm) -> dict:
    """The state saved at ``step`` by the local-tier tests: a (24, 3) array
    sharded by rows, a replicated int64 array and the step as a value."""
    w = pattern(f"w{step}", (24, 3))
    start, count = block(24, comm.rank, comm.size)
    return {"w": mhckpt.Shard(w[start:start + count], offset=(start, 0), global_shape=w.shape),
            "b": pattern(f"b{step}", (5,), "int64"), "step": step}


def free_port(comm) -> int:
    """A TCP port free on this host, chosen by rank 0 and broadcast. (The
    tests run on one host; ctest may run several jobs at once, so a fixed
    port could collide.)"""
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return comm.bcast(port, root=0)
