"""CheckpointManager: the catalogue (latest_step, all_steps), retention, the
context manager, and the properties a training loop reads."""
from __future__ import annotations

import os

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, pattern


def step_dirs(root):
    return sorted(d for d in os.listdir(root) if d.startswith("step_"))


def test_empty_root(comm, mgr):
    assert mgr.latest_step() is None and mgr.all_steps() == []
    assert (mgr.rank, mgr.world_size) == (comm.rank, comm.size)
    assert mgr.async_save  # mpi4py gives MPI_THREAD_MULTIPLE
    assert repr(mgr) == (
        f"CheckpointManager(root={mgr.root!r}, rank={comm.rank}, world_size={comm.size})"
    )


def test_plain_values_only(mgr):
    """A step without arrays (a JSON item of mhckpt.orbax, a DCP state dict of
    plain values): nothing to reserve or write, the values in the marker."""
    mgr.save(3, {"epoch": 7, "name": "run", "cfg": {"lr": 0.5, "none": None}})
    mgr.wait_until_finished()
    assert mgr.restore(3) == {"epoch": 7, "name": "run", "cfg": {"lr": 0.5, "none": None}}
    assert mgr.verify(3) == 0 and mgr.describe(3)["arrays"] == {}


def test_max_to_keep(comm, root):
    with mhckpt.CheckpointManager(root, max_to_keep=2) as mgr:
        for step in (10, 20, 30, 40, 50):
            mgr.save(step, {"w": np.full(3, step, np.int32)})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [40, 50] and mgr.latest_step() == 50
        comm.Barrier()
        assert step_dirs(root) == ["step_0000000040", "step_0000000050"]
        all_equal_bytes(comm, mgr.restore(40)["w"], np.full(3, 40, np.int32), "step 40")
        with pytest.raises(mhckpt.NotFoundError):
            mgr.restore(30)


def test_keep_period(comm, root):
    with mhckpt.CheckpointManager(root, max_to_keep=1, keep_period=3) as mgr:
        for step in range(1, 8):
            mgr.save(step, {"w": np.full(2, step, np.int8)})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [3, 6, 7]  # multiples of 3, and the newest
    # A manager opened later sees the same steps.
    with mhckpt.CheckpointManager(root) as again:
        assert again.all_steps() == [3, 6, 7] and again.latest_step() == 7
        all_equal_bytes(comm, again.restore(6)["w"], np.full(2, 6, np.int8), "step 6")


def test_context_manager_waits_and_closes(comm, root):
    big = pattern("ctx", (256, 1024), "float32")  # 1 MiB: the commit is still running at exit
    with mhckpt.CheckpointManager(root) as mgr:
        mgr.save(1, {"x": big})
    with pytest.raises(mhckpt.FailedPreconditionError, match="closed"):
        mgr.save(2, {"x": big})
    with mhckpt.CheckpointManager(root) as reader:
        assert reader.all_steps() == [1]
        all_equal_bytes(comm, reader.restore(1)["x"], big, "saved inside the with block")


def test_context_manager_on_exception(comm, root):
    with pytest.raises(KeyError):
        with mhckpt.CheckpointManager(root) as mgr:
            mgr.save(1, {"x": np.arange(4)})
            raise KeyError("the training loop failed")
    # Closed on the way out; close waited for the pending save.
    with pytest.raises(mhckpt.FailedPreconditionError):
        mgr.latest_step()
    with mhckpt.CheckpointManager(root) as reader:
        assert reader.all_steps() == [1]


def test_timings_and_staging(comm, mgr):
    x = pattern("t", (512, 512), "float32")  # 1 MiB
    mgr.save(1, {"x": x})
    mgr.wait_until_finished()
    t = mgr.last_save_timings()
    assert t["local_bytes"] == x.nbytes
    assert all(t[k] >= 0 for k in ("snapshot", "plan", "write", "flush", "commit"))
    assert mgr.staging_bytes() >= 0


def test_sync_save(comm, root):
    with mhckpt.CheckpointManager(root, async_save=False) as mgr:
        assert not mgr.async_save
        mgr.save(1, {"x": np.arange(5)})
        assert mgr.all_steps() == [1]  # committed before save returned


@pytest.mark.parametrize("data_path,format_version,files",
                         [("direct", 3, "one"), ("buffered", 3, "one"), ("hdf5", 3, "one"),
                          ("direct", 2, "one"), ("direct", 3, 1), ("buffered", 3, "node")])
def test_data_paths_and_writer_options(comm, root, data_path, format_version, files):
    # files: a data file per rank (1) or per node, behind data.h5's virtual datasets.
    n, rank = comm.size, comm.rank
    w = pattern("w", (40 * n, 300), "float32")
    r0 = rank * 40
    state = {"w": mhckpt.Shard(w[r0 : r0 + 40], (r0, 0), w.shape), "b": pattern("b", (7,), "int16")}
    opts = dict(data_path=data_path, writer_threads=3, checksum_chunk_bytes=4096,
                format_version=format_version, files=files)
    with mhckpt.CheckpointManager(root, **opts) as mgr:
        mgr.save(1, state)
        mgr.wait_until_finished()
        assert mgr.verify(1) == w.nbytes + state["b"].nbytes
        assert mgr.describe(1)["format_version"] == format_version
        # Subfiles: one per rank (files=1), or one for this one-node job.
        assert mgr.describe(1)["files"] == {"one": 0, 1: n, "node": 1}[files]
    step_dir = os.path.join(root, "step_%010d" % 1)
    assert os.path.exists(os.path.join(step_dir, "index.bin")) == (format_version == 3)
    assert os.path.exists(os.path.join(step_dir, "data-00000.h5")) == (files != "one")
    # Restored whole on every rank: each reads across the boxes the others wrote,
    # in small checksummed chunks (4 KiB).
    with mhckpt.CheckpointManager(root, own_root=False) as reader:
        out = reader.restore(1)
        all_equal_bytes(comm, out["w"], w, f"w through {data_path}")
        all_equal_bytes(comm, out["b"], state["b"], f"b through {data_path}")
