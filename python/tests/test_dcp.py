"""mhckpt.torch: DCP's functional API on mhckpt, at every world size (CPU,
gloo), against real torch.distributed.checkpoint. Loading at another world
size is test_examples.py's (the FSDP2 example saved at 2, loaded at 3)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, all_ok, raises_everywhere, torch_local

torch = pytest.importorskip("torch")
mdcp = pytest.importorskip("mhckpt.torch")
pytest.importorskip("torch.distributed.fsdp")


def fsdp2_model(td, seed: int):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 2 * td.size + 1), torch.nn.ReLU(),
                                torch.nn.Linear(2 * td.size + 1, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=td.mesh)
    fully_shard(model, mesh=td.mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_once(model, optim):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 6, generator=g)
    model(x).square().mean().backward()
    optim.step()
    optim.zero_grad()


def full(sd, prefix=""):
    """name -> full global numpy array (collective) or plain value."""
    from torch.distributed.tensor import DTensor

    out = {}
    items = sd.items() if isinstance(sd, dict) else enumerate(sd)
    for k, v in items:
        name = f"{prefix}{k}"
        if isinstance(v, (dict, list, tuple)):
            out.update(full(v, name + "/"))
        elif isinstance(v, torch.Tensor):
            out[name] = torch_local(v.full_tensor() if isinstance(v, DTensor) else v)
        else:
            out[name] = v
    return out


def test_fsdp2_model_and_optimizer_as_dcp(comm, torch_dist, root):
    """get_state_dict of an FSDP2 model and Adam, saved by DCP and by
    mhckpt.torch, loaded by each into a fresh model: the same bytes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optim = fsdp2_model(torch_dist, seed=0)
    train_once(model, optim)
    msd, osd = get_state_dict(model, optim)
    want = full({"model": msd, "optim": osd})
    paths = {"dcp": os.path.join(root, "dcp"), "mhckpt": os.path.join(root, "mhckpt")}
    dcp.save({"model": msd, "optim": osd, "step": 7}, checkpoint_id=paths["dcp"])
    mdcp.save({"model": msd, "optim": osd, "step": 7}, checkpoint_id=paths["mhckpt"])

    got = {}
    for name, backend in (("dcp", dcp), ("mhckpt", mdcp)):
        fresh, fresh_optim = fsdp2_model(torch_dist, seed=1)
        fmsd, fosd = get_state_dict(fresh, fresh_optim)
        state = {"model": fmsd, "optim": fosd, "step": 0}
        backend.load(state, checkpoint_id=paths[name])
        assert state["step"] == 7
        set_state_dict(fresh, fresh_optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        got[name] = full(dict(zip(("model", "optim"), get_state_dict(fresh, fresh_optim))))
    assert sorted(got["mhckpt"]) == sorted(want)
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            all_equal_bytes(comm, got["mhckpt"][k], v, f"mhckpt.torch: {k}")
            all_equal_bytes(comm, got["dcp"][k], v, f"dcp: {k}")
        else:
            assert got["mhckpt"][k] == v == got["dcp"][k], k


class Counter:
    """A Stateful object, as DCP takes at the top level of a state dict."""

    def __init__(self, n):
        self.n = n

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, sd):
        self.n = sd["n"]


def test_values_stateful_and_overwrite(comm, torch_dist, root):
    ckpt = os.path.join(root, "c")
    t = torch.arange(10, dtype=torch.float32)
    for version in (1, 2):  # the second save to the same checkpoint_id replaces the first
        state = {"t": t * version,
                 "cfg": {"betas": (0.9, 0.99 * version), "name": f"v{version}", "none": None},
                 "lst": [torch.ones(2, dtype=torch.int64) * version, version], "app": Counter(version)}
        mdcp.save(state, checkpoint_id=ckpt)
    with mhckpt.CheckpointManager(ckpt, own_root=False) as m:
        assert m.all_steps() == [1]
    into = {"t": torch.zeros(10), "cfg": {"betas": (0.0, 0.0), "name": "", "none": 1},
            "lst": [torch.zeros(2, dtype=torch.int64), 0], "app": Counter(0)}
    t_obj = into["t"]
    mdcp.load(into, checkpoint_id=ckpt)
    assert into["t"] is t_obj  # in place
    all_equal_bytes(comm, into["t"].numpy(), (t * 2).numpy(), "t")
    all_equal_bytes(comm, into["lst"][0].numpy(), np.full(2, 2, np.int64), "lst/0")
    assert into["cfg"] == {"betas": (0.9, 1.98), "name": "v2", "none": None}
    assert into["lst"][1] == 2 and isinstance(into["app"], Counter) and into["app"].n == 2


def test_async_save_then_change_in_place(comm, torch_dist, root):
    ckpt = os.path.join(root, "a")
    w = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    before = torch_local(w).copy()
    future = mdcp.async_save({"w": w}, checkpoint_id=ckpt)
    w.mul_(3)  # the save copied w before returning
    assert future.result(timeout=120) is None
    into = {"w": torch.empty(3, 4, dtype=torch.bfloat16)}
    mdcp.load(into, checkpoint_id=ckpt)
    all_equal_bytes(comm, torch_local(into["w"]), before, "w at the save")


def test_process_group_and_no_dist(comm, torch_dist, root):
    import torch.distributed as dist

    # no_dist: each rank alone, into its own directory.
    mine = os.path.join(root, f"rank{comm.rank}")
    mdcp.save({"r": torch.tensor([comm.rank])}, checkpoint_id=mine, no_dist=True)
    into = {"r": torch.tensor([-1])}
    mdcp.load(into, checkpoint_id=mine, no_dist=True)
    all_ok(comm, int(into["r"][0]) == comm.rank, "no_dist load")
    # A group of every rank but the last (all of them at world size 1).
    ranks = list(range(max(comm.size - 1, 1)))
    group = dist.new_group(ranks=ranks, backend="gloo")
    sub = os.path.join(root, "sub")
    if comm.rank in ranks:
        mdcp.save({"x": torch.full((4,), 5.0)}, checkpoint_id=sub, process_group=group)
        into = {"x": torch.zeros(4)}
        mdcp.load(into, checkpoint_id=sub, process_group=group)
        assert into["x"].tolist() == [5.0] * 4
    comm.Barrier()


def test_errors(comm, torch_dist, root):
    ckpt = os.path.join(root, "e")
    mdcp.save({"a": torch.zeros(2)}, checkpoint_id=ckpt)
    raises_everywhere(comm, mhckpt.NotFoundError,
                      lambda: mdcp.load({"a": torch.zeros(2), "b": torch.zeros(1)}, checkpoint_id=ckpt),
                      contains=["'b'"])
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mdcp.load({"a": torch.zeros(3)}, checkpoint_id=ckpt), contains=["'a'", "shape"])
    raises_everywhere(comm, mhckpt.NotFoundError,
                      lambda: mdcp.load({"a": torch.zeros(2)}, checkpoint_id=os.path.join(root, "none")))
    for kw in ({"storage_writer": object()}, {"planner": object()}):
        with pytest.raises(mhckpt.UnsupportedError, match=next(iter(kw))):
            mdcp.save({"a": torch.zeros(2)}, checkpoint_id=ckpt, **kw)
    with pytest.raises(mhckpt.UnsupportedError, match="storage_reader"):
        mdcp.load({"a": torch.zeros(2)}, checkpoint_id=ckpt, storage_reader=object())
