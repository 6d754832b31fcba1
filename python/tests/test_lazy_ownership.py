"""A lazy save owns every buffer it hands to the copier until the copy ends.

``save(..., lazy=True)`` passes C++ pointers into buffer objects, some of
which the Python layer makes for the call: the contiguous copy of a
transposed or strided numpy array, of a column slice in a ``Shard``, of a
transposed torch tensor, and the 0-d array of a numpy scalar. Nothing but
mhckpt references those after ``save`` returns, so mhckpt must hold them
until the copy has ended and drop them then. Here the allocator is churned
between ``save`` and ``fence.wait()`` (arrays of the same sizes allocated and
filled, ``gc.collect()``): memory freed under the copy would be reused and
overwritten, and the restored bytes would differ from the leaves. The gated
tests hold the copy at a fault-injection gate until the churn is done, so
that it lands before the copy every time; the others leave the timing to
the scheduler, over several saves.

Replicated leaves are saved with ``verify_replicas``: every rank's copy is
compared, not only rank 0's (which is the one written).
"""
from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import mhckpt
from mhckpt import _core
from support import all_equal_bytes, all_ok, block, pattern

_JUNK = 0x5A


def _state(comm, step: int) -> Dict[str, Any]:
    """Leaves whose buffers the Python layer copies before handing them to
    C++ (and a few it does not, beside them), different at every step."""
    n, rank = comm.size, comm.rank
    s = f"own{step}/"
    full = pattern(s + "rows", (24 * n + 1, 40), "float32")
    r0, rc = block(full.shape[0], rank, n)
    wide = pattern(s + "cols", (33, 16 * n + 3), "int32")
    c0, cc = block(wide.shape[1], rank, n)
    big = pattern(s + "big", (160, 512), "float64")  # 640 KiB: its copy is mmapped
    return {
        # This rank's rows, held transposed: a Shard of the transposed global array.
        "rows_t": mhckpt.Shard(np.ascontiguousarray(full[r0 : r0 + rc]).T, (0, r0), full.T.shape),
        # This rank's columns: a column slice of the global array (strided).
        "cols": mhckpt.Shard(wide[:, c0 : c0 + cc], (0, c0), wide.shape),
        "strided": pattern(s + "strided", (50, 90), "uint16")[1::2, ::3],
        "transposed": pattern(s + "transposed", (70, 30), "float16").T,
        "big_t": big.T,
        "counter": np.int64(1000 + step),
        "lr": np.float32(0.125 * step),
        "flag": np.bool_(step % 2 == 0),
        "zero_d": np.array(2.5 * step),
        "empty": np.zeros((0, 5), np.float32),
        "plain": pattern(s + "plain", (17, 9), "int8"),
    }


def _want(tree: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """The bytes each leaf holds now (a copy, row-major)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, mhckpt.Shard):
            v = v.local
        if type(v).__module__.startswith("torch"):
            v = v.numpy()
        out[k] = np.array(v, copy=True, order="C")
    return out


def _target(tree: Dict[str, Any]) -> Dict[str, Any]:
    """A restore target of the same structure: this rank's boxes, new buffers."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, mhckpt.Shard):
            out[k] = mhckpt.Shard(np.empty(np.shape(v.local), np.asarray(v.local).dtype),
                                  v.offset, v.global_shape)
        elif type(v).__module__.startswith("torch"):
            import torch

            out[k] = torch.empty(tuple(v.shape), dtype=v.dtype)
        else:
            out[k] = np.empty(np.shape(v), np.asarray(v).dtype)
    return out


def _check(comm, got: Dict[str, Any], want: Dict[str, np.ndarray], what: str) -> None:
    for k in sorted(want):
        g = got[k]
        if isinstance(g, mhckpt.Shard):
            g = g.local
        if type(g).__module__.startswith("torch"):
            g = g.numpy()
        all_equal_bytes(comm, np.asarray(g), want[k], f"{what}: '{k}'")


def _temporary_sizes(tree: Dict[str, Any]) -> List[int]:
    """Bytes of each buffer the Python layer copies or makes for the call."""
    sizes = []
    for v in tree.values():
        a = v.local if isinstance(v, mhckpt.Shard) else v
        if type(a).__module__.startswith("torch"):
            if not a.is_contiguous():
                sizes.append(a.numel() * a.element_size())
            continue
        if isinstance(a, np.generic) or not np.asarray(a).flags.c_contiguous:
            sizes.append(int(np.asarray(a).nbytes))
    return sizes


def _churn(sizes: List[int], torch_sizes: List[int] = ()) -> List[Any]:
    """Allocates and fills, many times over, arrays of the sizes that a
    save's temporaries had (and 0-d arrays of the scalars' dtypes), then
    collects garbage: memory freed under the copy comes back here and is
    overwritten. Returns them, to be dropped after the fence."""
    junk: List[Any] = []
    for nbytes in sizes:
        for _ in range(16):
            a = np.empty(max(nbytes, 1), np.uint8)
            a.fill(_JUNK)
            junk.append(a)
    for _ in range(256):
        junk.append(np.full((), -0x5A5A5A5A5A5A5A5A, np.int64))
        junk.append(np.full((), 1.0e30, np.float32))
        junk.append(np.full((), True, np.bool_))
    if torch_sizes:
        import torch

        for nbytes in torch_sizes:
            for _ in range(16):
                junk.append(torch.full((nbytes,), _JUNK, dtype=torch.uint8))
    gc.collect()
    return junk


def _gate(path: str) -> None:
    """This process's lazy copies wait at the gate until ``path`` exists."""
    for p in (path, f"{path}.reached"):
        if os.path.exists(p):
            os.unlink(p)
    _core._configure_fault(f"point=lazy_copy,action=wait,file={path}")


def _wait_for(path: str, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < end, f"{path} did not appear"
        time.sleep(0.005)


def _save_gated(comm, m, step: int, tree: Dict[str, Any], root: str, torch_sizes=()) -> None:
    """A lazy save whose copy waits until the allocator has been churned."""
    gate = f"{root}.gate.rank{comm.rank}"  # the fault point is this process's
    sizes = _temporary_sizes(tree)
    try:
        _gate(gate)
        fence = m.save(step, tree, lazy=True)
        _wait_for(f"{gate}.reached")  # the copy has started: it reads nothing yet
        junk = _churn(sizes, torch_sizes)
        open(gate, "w").close()
        fence.wait()
        del junk
    finally:
        _core._configure_fault("")
        for p in (gate, f"{gate}.reached"):
            if os.path.exists(p):
                os.unlink(p)


@pytest.fixture
def vmgr(root):
    m = mhckpt.CheckpointManager(root, collective_timeout_seconds=120, verify_replicas=True)
    yield m
    m.close()


def test_numpy_temporaries_outlive_the_copy_gated(comm, vmgr, root):
    if not vmgr.async_save:
        pytest.skip("lazy saves copy before returning without MPI_THREAD_MULTIPLE")
    wants = {}
    for step in (1, 2):
        tree = _state(comm, step)
        wants[step] = (_want(tree), _target(tree))
        _save_gated(comm, vmgr, step, tree, root)
        del tree
        gc.collect()
    vmgr.wait_until_finished()
    for step, (want, target) in wants.items():
        _check(comm, vmgr.restore(step, target), want, f"step {step}")


def test_numpy_temporaries_outlive_the_copy_under_churn(comm, vmgr):
    if not vmgr.async_save:
        pytest.skip("lazy saves copy before returning without MPI_THREAD_MULTIPLE")
    wants = {}
    for step in range(1, 6):
        tree = _state(comm, step)
        wants[step] = (_want(tree), _target(tree))
        sizes = _temporary_sizes(tree)
        fence = vmgr.save(step, tree, lazy=True)
        del tree
        junk = _churn(sizes)
        fence.wait()
        del junk
    vmgr.wait_until_finished()
    all_ok(comm, vmgr.all_steps() == [1, 2, 3, 4, 5], "every lazy save committed")
    for step, (want, target) in wants.items():
        _check(comm, vmgr.restore(step, target), want, f"step {step}")


def _torch_state(step: int) -> Dict[str, Any]:
    import torch

    s = f"owntorch{step}/"
    a = torch.from_numpy(pattern(s + "a", (96, 40), "float32"))
    b = torch.from_numpy(pattern(s + "b", (300, 200), "int16"))  # 117 KiB
    c = torch.from_numpy(pattern(s + "c", (7, 11, 13), "float64"))
    return {
        "a_t": a.T,
        "b_t": b.t(),
        "c_perm": c.permute(2, 0, 1),
        "c_slice": c[:, ::2, 1:],
        "contig": torch.from_numpy(pattern(s + "d", (8, 8), "int64")),
        "step": np.int64(step),
    }


def test_torch_transposed_temporaries_outlive_the_copy(comm, vmgr, root):
    pytest.importorskip("torch")
    if not vmgr.async_save:
        pytest.skip("lazy saves copy before returning without MPI_THREAD_MULTIPLE")
    wants = {}
    for step in (1, 2, 3):
        tree = _torch_state(step)
        wants[step] = (_want(tree), _target(tree))
        sizes = _temporary_sizes(tree)
        if step == 1:
            _save_gated(comm, vmgr, step, tree, root, torch_sizes=sizes)
        else:
            fence = vmgr.save(step, tree, lazy=True)
            del tree
            junk = _churn(sizes, sizes)
            fence.wait()
            del junk
    vmgr.wait_until_finished()
    for step, (want, target) in wants.items():
        _check(comm, vmgr.restore(step, target), want, f"step {step}")


def test_the_fence_drops_what_the_save_held(comm, mgr):
    """Once the fence completes, mhckpt holds no reference to the leaves."""
    if not mgr.async_save:
        pytest.skip("lazy saves copy before returning without MPI_THREAD_MULTIPLE")
    x = pattern("own/held", (64, 48), "float32").T  # copied for the call
    y = pattern("own/held_c", (64, 48), "float32")  # passed as is
    before = (sys.getrefcount(x), sys.getrefcount(y))
    fence = mgr.save(1, {"x": x, "y": y}, lazy=True)
    fence.wait()
    all_ok(comm, (sys.getrefcount(x), sys.getrefcount(y)) == before,
           f"references after the fence {(sys.getrefcount(x), sys.getrefcount(y))}, "
           f"before the save {before}")
    mgr.wait_until_finished()
    out = mgr.restore(1)
    all_equal_bytes(comm, out["x"], np.ascontiguousarray(x), "x")
    all_equal_bytes(comm, out["y"], y, "y")
