"""The local tier from Python: local_dir, persistent_every, step_tiers(), the
per-save tier and the restore source, and recovery after a node's local dir
is lost. Nodes are simulated with node_id (one rank per node), each with its
own local dir."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, open_node_local, pattern, raises_everywhere, tier_state


def test_tiers_and_sources(comm, root):
    with open_node_local(root, comm, persistent_every=2) as m:
        for step in range(4):
            m.save(step, tier_state(step, comm))
        m.save(4, tier_state(4, comm), tier="local")
        m.wait_until_finished()
        tiers = m.step_tiers()
        assert tiers == {0: {"persistent": True, "local": False},
                         2: {"persistent": True, "local": False},
                         3: {"persistent": False, "local": True},
                         4: {"persistent": False, "local": True}}, tiers
        assert m.latest_step() == 4 and m.all_steps() == [0, 2, 3, 4]
        for step, source in ((3, "any"), (4, "local"), (2, "persistent")):
            out = m.restore(step, source=source)
            all_equal_bytes(comm, out["w"], pattern(f"w{step}", (24, 3)), f"w of step {step}")
            all_equal_bytes(comm, out["b"], pattern(f"b{step}", (5,), "int64"), f"b of {step}")
            assert out["step"] == step
        raises_everywhere(comm, mhckpt.NotFoundError, lambda: m.restore(2, source="local"),
                          contains=["not in the local tier"])
        raises_everywhere(comm, mhckpt.InvalidArgumentError,
                          lambda: m.save(5, tier_state(5, comm), tier="somewhere"),
                          contains=["somewhere"])


def test_subfiles_with_the_local_tier(comm, root):
    # Both tiers, and a shared root with a subfile per rank: the local tier's
    # steps have none (a reused plan must not carry them there).
    with open_node_local(root, comm, persistent_every=1, files=1) as m:
        for step in range(3):
            m.save(step, tier_state(step, comm))
        m.wait_until_finished()
        assert m.step_tiers()[2] == {"persistent": True, "local": True}
        step_dir = os.path.join(root, "shared", "step_%010d" % 2)
        with open(os.path.join(step_dir, "commit.json")) as f:
            assert json.load(f)["files"] == comm.size
        assert os.path.exists(os.path.join(step_dir, "data-%05d.h5" % (comm.size - 1)))
        for source in ("local", "persistent"):
            out = m.restore(2, source=source)
            all_equal_bytes(comm, out["w"], pattern("w2", (24, 3)), f"w from {source}")
            assert out["step"] == 2


def test_node_loss_restores_from_copies(comm, root):
    with open_node_local(root, comm, persistent_every=10) as m:
        m.save(0, tier_state(0, comm))
        m.save(1, tier_state(1, comm))
    comm.Barrier()
    if comm.rank == 0:  # the last node is lost; its replacement starts empty
        shutil.rmtree(os.path.join(root, f"node{comm.size - 1}"))
    comm.Barrier()
    with open_node_local(root, comm, persistent_every=10) as m:
        want = 1 if comm.size > 1 else 0  # one node: nothing else held a copy
        assert m.latest_step() == want
        out = m.restore(want)
        all_equal_bytes(comm, out["w"], pattern(f"w{want}", (24, 3)), "w after the node loss")
        assert out["step"] == want


def test_bad_local_options_raise_everywhere(comm, root):
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: open_node_local(root, comm, local_max_to_keep=0),
                      contains=["local_max_to_keep"])
    if comm.size > 1:
        raises_everywhere(comm, mhckpt.InvalidArgumentError,
                          lambda: open_node_local(root, comm, persistent_every=1 + comm.rank % 2),
                          contains=["persistent_every differs"])


def test_parity_rebuilds_a_lost_node(comm, root):
    if comm.size < 3:
        pytest.skip("a parity group of three nodes or more")
    with open_node_local(root, comm, persistent_every=10, local_parity_group=comm.size) as m:
        m.save(0, tier_state(0, comm))
        m.save(1, tier_state(1, comm))
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(os.path.join(root, "node1"))
    comm.Barrier()
    with open_node_local(root, comm, persistent_every=10, local_parity_group=comm.size) as m:
        assert m.step_tiers()[1] == {"persistent": False, "local": True}
        out = m.restore(1, source="local")
        all_equal_bytes(comm, out["w"], pattern("w1", (24, 3)), "w rebuilt from parity")
