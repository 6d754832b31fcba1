"""Restore N -> M: a checkpoint saved by a job of N ranks restores in a job
of M ranks, into other shardings, with numpy Shards, jax and torch leaves.

One mpirun job has one world size, so this file runs in two kinds of job
(ctest: python.npN saves, python.reshard.restore_at_M restores;
tests/CMakeLists.txt):

    run_pytest.sh N python/tests --reshard-mode save --reshard-dir D
    run_pytest.sh M python/tests/test_reshard.py --reshard-mode restore --reshard-dir D \\
        --reshard-from 1,2,4

The save writes D/fromN; the restore checks every D/fromN of --reshard-from.
The data is a function of (name, global index) only, so the restoring job
knows every expected byte. Without --reshard-mode the tests skip. (The
options come from python/tests/conftest.py: pytest knows them when a path
under python/tests is among the arguments.)
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, all_ok, block, dtensor_slice, pattern, torch_local

STEP = 100

# name -> (global shape, dtype). The jax shapes divide by 1, 2, 3 and 4
# (jax shards evenly); the others split unevenly at most sizes.
NUMPY = {"np/rows": ((23, 7), "float32"), "np/cols": ((5, 19), "int64"),
         "np/cube": ((3, 10, 4), "uint16"), "np/rep": ((4, 4), "bfloat16")}
JAX = {"jax/rows": ((24, 12), "float32"), "jax/cols": ((12, 24), "bfloat16"),
       "jax/rep": ((5, 3), "int32")}
TORCH = {"torch/rows": ((13, 6), "float32"), "torch/cols": ((4, 11), "int16"),
         "torch/rep": ((3, 3), "float64"), "torch/param": ((2, 5), "float32")}
ALL = {**NUMPY, **JAX, **TORCH}


def data(name):
    shape, dtype = ALL[name]
    return pattern("reshard/" + name, shape, dtype)


def pytest_generate_tests(metafunc):
    if "source_size" in metafunc.fixturenames:
        option = metafunc.config.getoption("--reshard-from") or ""
        sizes = [int(s) for s in option.split(",") if s]
        metafunc.parametrize("source_size", sizes, ids=[f"from{n}" for n in sizes])


@pytest.fixture
def reshard_dir(request):
    mode = request.config.getoption("--reshard-mode")
    path = request.config.getoption("--reshard-dir")
    if mode is None:
        pytest.skip("run by ctest's python.reshard.* tests (--reshard-mode, --reshard-dir)")
    if not path:
        pytest.fail("--reshard-mode needs --reshard-dir")
    return mode, path


def box(rank, size, shape, dim):
    """The slices of the ``dim`` block of ``rank`` (np.array_split's split)."""
    start, count = block(shape[dim], rank, size)
    index = [slice(None)] * len(shape)
    index[dim] = slice(start, start + count)
    return tuple(index), start


def shard_of(name, rank, size, dim):
    full = data(name)
    index, start = box(rank, size, full.shape, dim)
    offset = [0] * full.ndim
    offset[dim] = start
    return mhckpt.Shard(full[index], offset, full.shape)


def test_save(comm, reshard_dir, jax_dist, torch_dist):
    mode, path = reshard_dir
    if mode != "save":
        pytest.skip("this job restores")
    from torch.distributed.tensor import Replicate, Shard

    n, rank = comm.size, comm.rank
    jd, td = jax_dist, torch_dist
    root = os.path.join(path, f"from{n}")
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    comm.Barrier()
    state = {
        "np": {
            "rows": shard_of("np/rows", rank, n, 0),
            "cols": shard_of("np/cols", rank, n, 1),  # a non-contiguous block
            "cube": shard_of("np/cube", rank, n, 1),
            "rep": data("np/rep"),
        },
        "jax": {
            "rows": jd.array(data("jax/rows"), jd.sharding(("x", None))),
            "cols": jd.array(data("jax/cols"), jd.sharding((None, "x"))),
            "rep": jd.array(data("jax/rep"), jd.sharding(())),
        },
        "torch": {
            "rows": td.dtensor(data("torch/rows"), Shard(0)),
            "cols": td.dtensor(data("torch/cols"), Shard(1)),
            "rep": td.dtensor(data("torch/rep"), Replicate()),
            "param": td.torch.nn.Parameter(td.torch.from_numpy(data("torch/param").copy())),
        },
        "values": {"saved_at": n, "name": "reshard ✓"},
    }
    with mhckpt.CheckpointManager(root) as mgr:
        mgr.save(STEP, state, metadata={"world_size": n})
        mgr.wait_until_finished()
        assert mgr.verify(STEP) == sum(data(k).nbytes for k in ALL)
        d = mgr.describe(STEP)
    assert d["world_size"] == n and set(d["arrays"]) == set(ALL)


def test_restore(comm, reshard_dir, source_size, jax_dist, torch_dist):
    mode, path = reshard_dir
    if mode != "restore":
        pytest.skip("this job saves")
    from torch.distributed.tensor import Shard

    m, rank = comm.size, comm.rank
    jd, td = jax_dist, torch_dist
    torch = td.torch
    root = os.path.join(path, f"from{source_size}")
    with mhckpt.CheckpointManager(root) as mgr:
        assert mgr.latest_step() == STEP
        d = mgr.describe(STEP)
        assert d["world_size"] == source_size and d["metadata"] == {"world_size": source_size}
        assert d["values"] == {"values/saved_at": source_size, "values/name": "reshard ✓"}

        # Every array, whole, as numpy.
        whole = mgr.restore(STEP)
        for name in ALL:
            group, leaf = name.split("/")
            all_equal_bytes(comm, whole[group][leaf], data(name),
                            f"{name} from {source_size}, whole")
        assert whole["values"]["saved_at"] == source_size

        # Other shardings than at save, on this job's ranks.
        def zeros_like(name):
            return np.zeros_like(data(name))

        target = {
            "np": {
                "rows": shard_of("np/rows", rank, m, 1),   # by columns now
                "cols": shard_of("np/cols", rank, m, 0),   # by rows now
                "cube": shard_of("np/cube", m - 1 - rank, m, 0),
            },
            "jax": {
                "rows": jd.jax.ShapeDtypeStruct(JAX["jax/rows"][0], data("jax/rows").dtype,
                                                sharding=jd.sharding((None, "x"))),
                "cols": jd.jax.ShapeDtypeStruct(JAX["jax/cols"][0], data("jax/cols").dtype,
                                                sharding=jd.sharding(("x", None))),
                "rep": jd.jax.ShapeDtypeStruct(JAX["jax/rep"][0], data("jax/rep").dtype,
                                               sharding=jd.sharding(())),
            },
            "torch": {
                "rows": td.dtensor(zeros_like("torch/rows"), Shard(1)),
                "cols": td.dtensor(zeros_like("torch/cols"), Shard(0)),
                "rep": td.dtensor(zeros_like("torch/rep"), Shard(0)),  # 3 rows: empty on rank 3
                "param": torch.nn.Parameter(torch.zeros(TORCH["torch/param"][0])),
            },
            "values": {"saved_at": -1},
        }
        for leaf in target["np"].values():
            leaf.local[...] = 0  # shard_of gave the expected bytes: start from zeros
        out = mgr.restore(STEP, target)

    for leaf, dim in (("rows", 1), ("cols", 0)):
        index, _ = box(rank, m, ALL[f"np/{leaf}"][0], dim)
        all_equal_bytes(comm, out["np"][leaf].local, data(f"np/{leaf}")[index], f"np/{leaf}")
    index, _ = box(m - 1 - rank, m, ALL["np/cube"][0], 0)
    all_equal_bytes(comm, out["np"]["cube"].local, data("np/cube")[index], "np/cube")

    for leaf, t in target["jax"].items():
        arr = out["jax"][leaf]
        all_ok(comm, arr.sharding.is_equivalent_to(t.sharding, arr.ndim), f"jax/{leaf} sharding")
        for s in arr.addressable_shards:
            all_equal_bytes(comm, np.asarray(s.data), data(f"jax/{leaf}")[s.index],
                            f"jax/{leaf} {s.index}")

    for leaf, placement in (("rows", Shard(1)), ("cols", Shard(0)), ("rep", Shard(0))):
        assert out["torch"][leaf] is target["torch"][leaf]
        want = dtensor_slice(td, data(f"torch/{leaf}"), placement)
        all_equal_bytes(comm, torch_local(out["torch"][leaf]), want, f"torch/{leaf} as {placement}")
    assert out["torch"]["param"] is target["torch"]["param"] and out["torch"]["param"].requires_grad
    all_equal_bytes(comm, torch_local(out["torch"]["param"]), data("torch/param"), "torch/param")
    assert out["values"]["saved_at"] == source_size


# A step saved at a preemption notice (test_preemption.py has the agreement
# itself): saved at N ranks in PATH/preempted_fromN, restored at M.
PREEMPTED = {"p/rows": ((17, 5), "float32"), "p/rep": ((6,), "int32")}


def preempted_data(name):
    shape, dtype = PREEMPTED[name]
    return pattern("reshard/" + name, shape, dtype)


def test_save_preempted(comm, reshard_dir):
    mode, path = reshard_dir
    if mode != "save":
        pytest.skip("this job restores")
    n, rank = comm.size, comm.rank
    root = os.path.join(path, f"preempted_from{n}")
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    comm.Barrier()
    with mhckpt.CheckpointManager(root, save_interval_steps=1000, preemption_grace_seconds=60) as mgr:
        for step in range(1, 20):
            if step == 4 and rank == n - 1:
                mhckpt.notify_preemption()  # one rank's notice
            if mgr.should_save(step):
                state = {"p": {"rows": shard_of_preempted("p/rows", rank, n), "rep": preempted_data("p/rep")}}
                mgr.save(step, state, metadata={"agreed": step})
            if mgr.reached_preemption(step):
                mgr.wait_until_finished()
                break
        assert mgr.all_steps() == [step] and step in (5, 6)
        assert mgr.describe(step)["preemption"]["grace_seconds"] == 60


def shard_of_preempted(name, rank, size):
    full = preempted_data(name)
    start, count = block(full.shape[0], rank, size)
    return mhckpt.Shard(full[start:start + count], (start, 0), full.shape)


def test_restore_preempted(comm, reshard_dir, source_size):
    mode, path = reshard_dir
    if mode != "restore":
        pytest.skip("this job saves")
    m, rank = comm.size, comm.rank
    with mhckpt.CheckpointManager(os.path.join(path, f"preempted_from{source_size}")) as mgr:
        step = mgr.latest_step()
        d = mgr.describe(step)
        assert d["metadata"] == {"agreed": step} and d["world_size"] == source_size
        assert d["preemption"] is not None and d["preemption"]["grace_seconds"] == 60
        target = {"p": {"rows": shard_of_preempted("p/rows", m - 1 - rank, m), "rep": None}}
        target["p"]["rows"].local[...] = 0
        out = mgr.restore(step, target)
    start, count = block(17, m - 1 - rank, m)
    all_equal_bytes(comm, out["p"]["rows"].local, preempted_data("p/rows")[start:start + count],
                    f"p/rows from {source_size}")
    all_equal_bytes(comm, out["p"]["rep"], preempted_data("p/rep"), f"p/rep from {source_size}")
