"""Lazy saves (``save(..., lazy=True)``) and staging built ahead (``reserve``).

A lazy save returns before copying; its fence completes when every local
buffer is copied. Bytes restored must be those of the moment of the save when
the caller waits on the fence before writing; a jax.Array donated before the
copy ends must fail the save on every rank, naming the array, and leave no
step behind. The donation test holds the copy at a gate (a fault-injection
point of the C++ core) so that the donation lands during the copy every time.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import mhckpt
from mhckpt import _core
from support import all_equal_bytes, all_ok, block, pattern, raises_everywhere


def test_numpy_lazy_restores_the_bytes_of_the_save(comm, mgr):
    n, rank = comm.size, comm.rank
    rows = pattern("lazy/rows", (128 * n + 5, 256), "float32")
    r0, rc = block(rows.shape[0], rank, n)
    buf = rows[r0 : r0 + rc].copy()
    rep = pattern("lazy/rep", (64, 64), "float64").copy()
    want = []
    for step in (1, 2, 3):
        buf += step
        rep += step
        want.append((rows[r0 : r0 + rc] + sum(range(1, step + 1)), rep.copy()))
        fence = mgr.save(step, {"rows": mhckpt.Shard(buf, (r0, 0), rows.shape), "rep": rep},
                         lazy=True, protect_host=(step == 2))
        assert isinstance(fence, mhckpt.SaveFence)
        fence.wait()
        assert fence.done()
    mgr.wait_until_finished()
    assert mgr.all_steps() == [1, 2, 3]
    for step, (want_rows, want_rep) in zip((1, 2, 3), want):
        out = mgr.restore(step, {"rows": mhckpt.Shard(np.empty_like(buf), (r0, 0), rows.shape),
                                 "rep": np.empty_like(rep)})
        all_equal_bytes(comm, out["rows"].local, want_rows.astype(np.float32), f"step {step} rows")
        all_equal_bytes(comm, out["rep"], want_rep, f"step {step} rep")


def test_blocking_save_returns_a_completed_fence(comm, mgr):
    fence = mgr.save(1, {"x": np.arange(10.0)})
    assert fence.done()
    fence.wait()
    mgr.wait_until_finished()


def _gate(path: str) -> None:
    """Lazy copies wait at the gate until ``path`` exists."""
    _core._configure_fault(f"point=lazy_copy,action=wait,file={path}")


def _wait_for(path: str, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < end, f"{path} did not appear"
        time.sleep(0.01)


def test_jax_donated_before_the_fence_fails_the_save_everywhere(comm, jax_dist, root):
    jd = jax_dist
    jax = jd.jax
    n = comm.size
    rows = pattern("lazy/jax", (64 * n, 128), "float32")
    state = {"w": jd.array(rows, jd.sharding(("x", None))),
             "b": jd.array(rows[:4], jd.sharding(()))}
    step_fn = jax.jit(lambda s: {k: v * 2 for k, v in s.items()}, donate_argnums=0)
    gate = f"{root}.gate"
    if comm.rank == 0:  # a gate left open by an earlier run would let the copy through
        for p in (gate, f"{gate}.reached"):
            if os.path.exists(p):
                os.unlink(p)
    comm.Barrier()
    with mhckpt.CheckpointManager(root, collective_timeout_seconds=120) as m:
        try:
            _gate(gate)
            fence = m.save(1, state, lazy=True)
            _wait_for(f"{gate}.reached")  # this rank's copy is held at the gate
            new = step_fn(state)  # the bug: donating before fence.wait()
            jax.block_until_ready(new)
            all_ok(comm, state["w"].is_deleted(), "donated")
            comm.Barrier()
            if comm.rank == 0:
                open(gate, "w").close()
            fence.wait()
        finally:
            _core._configure_fault("")
        raises_everywhere(comm, mhckpt.InvalidArgumentError, m.wait_until_finished,
                          contains=("array '", "donated or deleted", "rank "))
        assert m.all_steps() == []
        # Waiting before donating, as the loop should: the next save commits.
        fence = m.save(2, new, lazy=True)
        fence.wait()
        newer = step_fn(new)
        m.wait_until_finished()
        out = m.restore(2)
        all_equal_bytes(comm, out["w"], rows * 2, "w saved lazily, donated after the fence")
        del newer
    if comm.rank == 0:
        for p in (gate, f"{gate}.reached"):
            if os.path.exists(p):
                os.unlink(p)


def test_reserve_maps_staging_before_the_first_save(comm, root):
    n, rank = comm.size, comm.rank
    rows = pattern("reserve/rows", (256 * n, 1024), "float32")  # 1 MiB per rank
    r0, rc = block(rows.shape[0], rank, n)
    state = {"rows": mhckpt.Shard(rows[r0 : r0 + rc].copy(), (r0, 0), rows.shape)}
    with mhckpt.CheckpointManager(root, reserve=state) as m:
        reserved = m._impl.staging_bytes()
        all_ok(comm, reserved >= rc * 1024 * 4, f"reserved {reserved} bytes")
        m.save(1, state)
        m.wait_until_finished()
        all_ok(comm, m._impl.staging_bytes() == reserved, "the first save used the reserved staging")
        all_equal_bytes(comm, m.restore(1)["rows"], rows, "rows")


def test_reserve_counts_the_local_shards_of_eval_shape(comm, jax_dist):
    jd = jax_dist
    jax = jd.jax
    n = comm.size
    s = jax.ShapeDtypeStruct((8 * n, 16), np.float32, sharding=jd.sharding(("x", None)))
    r = jax.ShapeDtypeStruct((3, 5), np.float16, sharding=jd.sharding(()))
    from mhckpt import _leaves

    assert _leaves.local_bytes(s) == 8 * 16 * 4
    assert _leaves.local_bytes(r) == 3 * 5 * 2
    assert _leaves.local_bytes(np.zeros((2, 3), np.int64)) == 48
    assert _leaves.local_bytes(7) == 0


def test_jax_marks_a_donated_array_deleted_before_xla_writes_it(comm, jax_dist):
    """What the donation check of a lazy save rests on: a thread polling a
    donated array's is_deleted() and the last element of its buffer during
    the donating step never sees the buffer written while the array still
    reads as alive (the check runs after the copy: an array alive then was
    untouched during the whole copy)."""
    import ctypes
    import threading

    jd = jax_dist
    jax = jd.jax
    n = comm.size
    rows = np.ones((4096 * n, 1024), np.float32)  # 16 MiB per rank
    step_fn = jax.jit(lambda a: jax.numpy.sin(a) * 2 + 3, donate_argnums=0)
    jax.block_until_ready(step_fn(jd.array(rows, jd.sharding(("x", None)))))  # compiled
    x = jd.array(rows, jd.sharding(("x", None)))
    jax.block_until_ready(x)
    shard = x.addressable_shards[0].data
    ptr = shard.unsafe_buffer_pointer()
    last = ctypes.c_float.from_address(ptr + 4 * (shard.size - 1))
    del shard
    seen, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            deleted = x.is_deleted()
            seen.append((deleted, last.value))

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.01)
    y = step_fn(x)
    jax.block_until_ready(y)
    time.sleep(0.01)
    stop.set()
    t.join()
    # The donation took place: XLA wrote its output into the same buffer.
    all_ok(comm, y.addressable_shards[0].data.unsafe_buffer_pointer() == ptr and last.value != 1.0,
           "the output reused the donated buffer")
    written_while_alive = [v for d, v in seen if not d and v != 1.0]
    all_ok(comm, x.is_deleted() and not written_while_alive,
           f"{len(written_while_alive)} of {len(seen)} samples saw the buffer written while alive")
