"""The first promise: when ``save`` returns, the checkpoint no longer depends
on any caller buffer. Every buffer is overwritten, deleted or refilled right
after ``save`` and before ``wait_until_finished``; the restore must give the
values of the moment of the save."""
from __future__ import annotations

import gc

import numpy as np

import mhckpt
from support import all_equal_bytes, all_ok, block, pattern


def test_numpy_buffers_overwritten_and_freed(comm, mgr):
    n, rank = comm.size, comm.rank
    rep = pattern("rep", (256, 256), "float32")          # 256 KiB, replicated
    rows = pattern("rows", (97 * n + 3, 64), "float64")  # sharded, uneven
    r0, rc = block(rows.shape[0], rank, n)
    rep_buf, rows_buf = rep.copy(), rows[r0 : r0 + rc].copy()
    for step in (1, 2):  # the second save reuses the staging memory of the first
        mgr.save(step, {"rep": rep_buf, "rows": mhckpt.Shard(rows_buf, (r0, 0), rows.shape)})
        rep_buf[...] = -step  # overwritten at once, then the next save's values
        rows_buf[...] = np.nan
    del rep_buf, rows_buf
    gc.collect()
    mgr.wait_until_finished()
    assert mgr.all_steps() == [1, 2]
    for step, want_rep in ((1, rep), (2, np.full_like(rep, -1))):
        out = mgr.restore(step)
        all_equal_bytes(comm, out["rep"], want_rep, f"step {step} rep")
    all_equal_bytes(comm, mgr.restore(1)["rows"], rows, "rows")


def test_jax_arrays_deleted(comm, jax_dist, mgr):
    jd = jax_dist
    n = comm.size
    rows = pattern("jax/rows", (64 * n, 128), "float32")
    rep = pattern("jax/rep", (128, 64), "bfloat16")
    state = {
        "rows": jd.array(rows, jd.sharding(("x", None))),
        "rep": jd.array(rep, jd.sharding(())),  # the Orbax bug's path: fully replicated
    }
    mgr.save(1, state)
    for a in state.values():
        a.delete()
    all_ok(comm, all(a.is_deleted() for a in state.values()), "deleted")
    del state
    gc.collect()
    mgr.wait_until_finished()
    out = mgr.restore(1)
    all_equal_bytes(comm, out["rows"], rows, "deleted row-sharded jax.Array")
    all_equal_bytes(comm, out["rep"], rep, "deleted replicated jax.Array")


def test_torch_tensors_refilled(comm, torch_dist, mgr):
    td = torch_dist
    torch = td.torch
    from torch.distributed.tensor import Shard

    n = comm.size
    w = pattern("t/w", (128, 128), "float32")
    d = pattern("t/d", (33 * n + 1, 16), "int64")
    state = {"w": torch.from_numpy(w.copy()), "d": td.dtensor(d, Shard(0))}
    mgr.save(1, state)
    with torch.no_grad():
        state["w"].fill_(7)
        state["d"].to_local().zero_()
    mgr.wait_until_finished()
    all_ok(comm, bool((state["w"] == 7).all()), "the tensor was refilled")
    out = mgr.restore(1)
    all_equal_bytes(comm, out["w"], w, "refilled tensor")
    all_equal_bytes(comm, out["d"], d, "refilled DTensor")
