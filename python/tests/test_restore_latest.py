"""restore_latest: the newest step that restores intact, from Python. Nodes are
simulated with node_id (one rank per node), each with its own local dir; damage
is two flipped bytes of a rank's file of a local step, on every node that holds
one."""
from __future__ import annotations

import os

import numpy as np
import pytest

import mhckpt
from support import (all_equal_bytes, block, open_node_local, pattern, raises_everywhere,
                     tier_state)


def _damage(root: str, comm, step: int, writer: int = 0) -> None:
    """Rank 0 flips two bytes of ``writer``'s file of local ``step`` on every
    node that holds it."""
    comm.Barrier()
    if comm.rank == 0:
        for node in range(comm.size):
            path = os.path.join(root, f"node{node}", "step_%010d" % step, f"w{writer}.bin")
            if not os.path.exists(path):
                continue
            with open(path, "r+b") as f:
                for at in (3, 12):
                    f.seek(at)
                    c = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes([c ^ 0x41]))
    comm.Barrier()


def test_restore_latest_skips_a_damaged_step(comm, root):
    # Shared root: 0; local tier: 1, 2.
    with open_node_local(root, comm, persistent_every=3) as m:
        for step in range(3):
            m.save(step, tier_state(step, comm))
    _damage(root, comm, 2)
    with open_node_local(root, comm, persistent_every=3) as m:
        assert m.latest_step() == 2  # committed, not verified
        step, out = m.restore_latest()
        assert step == 1, step
        all_equal_bytes(comm, out["w"], pattern("w1", (24, 3)), "w of step 1")
        all_equal_bytes(comm, out["b"], pattern("b1", (5,), "int64"), "b of step 1")
        assert out["step"] == 1  # a non-array leaf of the step restored
        # Into a target of the caller's, in place.
        start, count = block(24, comm.rank, comm.size)
        mine = np.zeros((count, 3), np.float32)
        target = {"w": mhckpt.Shard(mine, offset=(start, 0), global_shape=(24, 3)),
                  "b": np.zeros(5, np.int64), "step": None}
        step, out = m.restore_latest(target)
        assert step == 1 and out["step"] == 1
        assert np.array_equal(mine, pattern("w1", (24, 3))[start:start + count])
    _damage(root, comm, 1)
    with open_node_local(root, comm, persistent_every=3) as m:
        step, out = m.restore_latest()
        assert step == 0, step
        all_equal_bytes(comm, out["w"], pattern("w0", (24, 3)), "w of step 0")
        raises_everywhere(comm, mhckpt.NotFoundError,
                          lambda: m.restore_latest(source="local"),
                          contains=["restores intact", "step 2 in the local tier"])


def test_restore_latest_serves_a_damaged_file_from_its_copy(comm, root):
    if comm.size < 2:
        pytest.skip("needs two nodes")
    with open_node_local(root, comm, persistent_every=3) as m:
        for step in range(2):
            m.save(step, tier_state(step, comm))
    comm.Barrier()
    if comm.rank == 0:  # node 0's own file only; node 1 keeps a copy
        path = os.path.join(root, "node0", "step_%010d" % 1, "w0.bin")
        with open(path, "r+b") as f:
            f.seek(3)
            c = f.read(1)[0]
            f.seek(3)
            f.write(bytes([c ^ 0x41]))
    comm.Barrier()
    with open_node_local(root, comm, persistent_every=3) as m:
        step, out = m.restore_latest()
        assert step == 1, step
        all_equal_bytes(comm, out["w"], pattern("w1", (24, 3)), "w served from the copy")


def test_restore_latest_with_nothing_saved_raises_not_found(comm, root):
    with open_node_local(root, comm) as m:
        raises_everywhere(comm, mhckpt.NotFoundError, lambda: m.restore_latest())
