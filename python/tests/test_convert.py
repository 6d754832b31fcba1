"""``python -m mhckpt convert``: a checkpoint written by real Orbax, one by
real DCP and one by the safetensors library, each converted into an mhckpt
step, restored and compared bit for bit with what was saved; and mhckpt steps
written out to safetensors and read back with the safetensors library.

The Orbax conversion runs ``python -m mhckpt convert`` as an mpirun job at 2
processes (world size 1 only: JAX's multi-process barriers inside Orbax's
reads would tie the suite's processes together); the DCP and safetensors
conversions call the same command's entry point in the suite's processes, at
every world size.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mhckpt
from support import pattern
from test_examples import MPIRUN, _mpirun_env, _unpin

from mhckpt import _convert, _sources
from support import all_equal_bytes, all_ok


def np_to_torch(a):
    return _sources.numpy_to_torch(np.asarray(a))


def convert(nproc: int, *args: str) -> str:
    if MPIRUN is None:
        pytest.skip("mpirun not found")
    cmd = [MPIRUN, "-np", str(nproc), "--oversubscribe", "--bind-to", "none",
           "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_vader_single_copy_mechanism", "none",
           sys.executable, "-m", "mhckpt", "convert", *args]
    p = subprocess.run(cmd, env=_mpirun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=180, preexec_fn=_unpin, cwd="/")
    assert p.returncode == 0, \
        f"convert {args} at {nproc} processes failed ({p.returncode}):\n{p.stdout[-4000:]}"
    return p.stdout


def restored(root: Path):
    """{name: array or value} of the latest step of an mhckpt root (collective)."""
    with mhckpt.CheckpointManager(str(root), own_root=False) as mgr:
        step = mgr.latest_step()
        out = mgr.restore(step)
    flat = {}

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + [k])
        else:
            flat["/".join(path)] = x

    walk(out, [])
    return step, flat


def same(got, want, name):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{name}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), \
        f"{name}: bytes differ"


@pytest.mark.skipif(int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1,
                    reason="starts its own mpirun job: runs at world size 1 only")
def test_orbax_checkpoint_converted(tmp_path, jax_dist):
    # jax_dist: jax.distributed starts before this test's first jax call (a
    # later test of this pytest run asks for it, and it must come first).
    jax = jax_dist.jax
    ocp = pytest.importorskip("orbax.checkpoint")
    data = {
        "params": {"w": pattern("cv/w", (9, 4), "float32"), "e": pattern("cv/e", (5, 3), "bfloat16")},
        "opt": [pattern("cv/m", (4,), "int8"), pattern("cv/mask", (2, 2), "bool")],
        "count": pattern("cv/count", (), "int32"),
    }
    src = tmp_path / "orbax"
    with ocp.CheckpointManager(str(src)) as mngr:
        state = jax.tree.map(jax.numpy.asarray, data)
        mngr.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                             meta=ocp.args.JsonSave({"lr": 0.25})))
        mngr.wait_until_finished()
    dst = tmp_path / "mh"
    out = convert(2, str(src), str(dst))  # the root: its latest step, 7
    assert "step 7: 5 arrays" in out, out
    step, flat = restored(dst)
    assert step == 7
    want = {"state/params/w": data["params"]["w"], "state/params/e": data["params"]["e"],
            "state/opt/0": data["opt"][0], "state/opt/1": data["opt"][1], "state/count": data["count"]}
    assert sorted(flat) == sorted(want)
    for k, v in want.items():
        same(flat[k], v, k)

    # mhckpt.orbax restores the converted step with the same args as Orbax.
    import mhckpt.orbax as mocp

    with mocp.CheckpointManager(str(dst), options=mocp.CheckpointManagerOptions(read_only=True)) as mngr:
        got = mngr.restore(7, args=mocp.args.Composite(state=mocp.args.StandardRestore(data),
                                                       meta=mocp.args.JsonRestore()))
    assert got.meta == {"lr": 0.25}
    # A lone item directory (StandardCheckpointer's), converted in this process:
    # a plain step named by the tree paths; a restore without a target gives
    # the lists back.
    lone = tmp_path / "lone"
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(str(lone / "state"), jax.tree.map(jax.numpy.asarray, data))
        ckptr.wait_until_finished()
    assert _convert.main([str(lone / "state"), str(tmp_path / "lone_mh")]) == 0
    step, flat = restored(tmp_path / "lone_mh")
    assert step == 0 and sorted(flat) == sorted(k[len("state/"):] for k in want)
    with mocp.StandardCheckpointer() as ckptr:
        lone_got = ckptr.restore(str(tmp_path / "lone_mh"))
    assert isinstance(lone_got["opt"], list)
    same(lone_got["opt"][0], data["opt"][0], "lone: opt/0")

    # Orbax's own directory is not read, and the error says how to convert it.
    with mocp.CheckpointManager(str(src), options=mocp.CheckpointManagerOptions(read_only=True)) as mngr:
        with pytest.raises(mhckpt.NotFoundError, match="python -m mhckpt convert"):
            mngr.restore(7)
    same(got.state["params"]["e"], data["params"]["e"], "mhckpt.orbax: e")
    same(got.state["opt"][1], data["opt"][1], "mhckpt.orbax: opt/1")


def test_dcp_checkpoint_converted(comm, root):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    from support import torch_local

    arrays = {
        "model": {"0.weight": pattern("cv/dw", (7, 5), "float32"),
                  "0.bias": pattern("cv/db", (7,), "bfloat16")},
        "optim": {"state": {"0.weight": {"step": pattern("cv/step", (), "float32"),
                                         "exp_avg": pattern("cv/ea", (7, 5), "float32")}}},
        "ids": pattern("cv/ids", (3, 2), "int64"),
    }
    sd = {
        "model": {k: np_to_torch(v) for k, v in arrays["model"].items()},
        "optim": {"state": {"0.weight": {k: np_to_torch(v)
                                         for k, v in arrays["optim"]["state"]["0.weight"].items()}},
                  "param_groups": [{"lr": 0.5, "betas": (0.9, 0.999), "params": ["0.weight"],
                                    "foreach": None}]},
        "ids": np_to_torch(arrays["ids"]),
        "step": 11,
    }
    src, dst = os.path.join(root, "dcp"), os.path.join(root, "mh")
    if comm.rank == 0:  # DCP's own writer, one process
        dcp.save(sd, checkpoint_id=src, no_dist=True)
    comm.Barrier()
    assert _convert.main([src, dst, "--step", "11"]) == 0
    step, flat = restored(dst)
    assert step == 11
    want = {"model/0.weight": arrays["model"]["0.weight"], "model/0.bias": arrays["model"]["0.bias"],
            "optim/state/0.weight/step": arrays["optim"]["state"]["0.weight"]["step"],
            "optim/state/0.weight/exp_avg": arrays["optim"]["state"]["0.weight"]["exp_avg"],
            "ids": arrays["ids"]}
    for k, v in want.items():
        all_equal_bytes(comm, flat[k], v, k)
    assert flat["step"] == 11 and flat["optim/param_groups/0/betas/1"] == 0.999
    assert flat["optim/param_groups/0/params/0"] == "0.weight"
    assert flat["optim/param_groups/0/foreach"] is None

    # mhckpt.torch.load fills the same state dict from the converted step.
    import mhckpt.torch as mdcp

    into = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}, "step": 0,
            "optim": {"state": {"0.weight": {k: torch.zeros_like(v)
                                             for k, v in sd["optim"]["state"]["0.weight"].items()}},
                      "param_groups": [{"lr": 0.0, "betas": (0.0, 0.0), "params": [""], "foreach": 1}]}}
    with pytest.raises(mhckpt.NotFoundError, match="python -m mhckpt convert"):
        mdcp.load(into, checkpoint_id=src)  # DCP's own files are not read
    mdcp.load(into, checkpoint_id=dst)
    all_equal_bytes(comm, torch_local(into["model"]["0.bias"]), arrays["model"]["0.bias"], "load: 0.bias")
    all_ok(comm, into["optim"]["param_groups"] == sd["optim"]["param_groups"] and into["step"] == 11,
           "load: plain values")


def test_sharded_dcp_checkpoint_converted(comm, torch_dist, root):
    # Saved by DCP at the suite's world size with DTensor leaves: a sharded
    # array is one chunk per rank (uneven rows), assembled by the converter;
    # a replicated one is saved once, whole.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    arrays = {"w": pattern("cv/sw", (2 * comm.size + 1, 5), "float32"),
              "e": pattern("cv/se", (comm.size + 2, 3), "bfloat16"),
              "r": pattern("cv/sr", (4,), "int32")}
    sd = {"model": {"w": distribute_tensor(np_to_torch(arrays["w"]), torch_dist.mesh, [Shard(0)]),
                    "e": distribute_tensor(np_to_torch(arrays["e"]), torch_dist.mesh, [Shard(0)]),
                    "r": distribute_tensor(np_to_torch(arrays["r"]), torch_dist.mesh, [Replicate()])}}
    src, dst = os.path.join(root, "dcp"), os.path.join(root, "mh")
    dcp.save(sd, checkpoint_id=src)
    comm.Barrier()
    assert _convert.main([src, dst]) == 0
    step, flat = restored(dst)
    assert step == 0 and sorted(flat) == [f"model/{k}" for k in sorted(arrays)]
    for k, v in arrays.items():
        all_equal_bytes(comm, flat[f"model/{k}"], v, k)


def test_safetensors_in_and_out(comm, root):
    pytest.importorskip("torch")
    safetensors = pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    arrays = {f"layers.{i}.weight": pattern(f"cv/l{i}", (6, 4 + i), ("float16", "bfloat16", "uint8")[i % 3])
              for i in range(5)}
    arrays["norm.scale"] = pattern("cv/norm", (4,), "float8_e4m3fn")
    arrays["norm.eps"] = pattern("cv/eps", (), "float32")
    src, dst, out = (os.path.join(root, d) for d in ("hf", "mh", "st"))
    if comm.rank == 0:  # a Hugging Face style sharded checkpoint
        os.makedirs(src)
        weight_map = {}
        for part, names in enumerate((sorted(arrays)[:3], sorted(arrays)[3:])):
            fn = f"model-{part + 1:05d}-of-00002.safetensors"
            tensors = {n: np_to_torch(arrays[n]) for n in names}
            save_file(tensors, os.path.join(src, fn), metadata={"format": "pt"})
            weight_map.update({n: fn for n in names})
        with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    comm.Barrier()
    assert _convert.main([src, dst]) == 0
    step, flat = restored(dst)
    assert step == 0 and sorted(flat) == sorted(arrays)
    for k, v in arrays.items():
        all_equal_bytes(comm, flat[k], v, k)
    with mhckpt.CheckpointManager(dst, own_root=False) as mgr:
        assert mgr.describe(0)["metadata"] == {"safetensors.metadata": {"format": "pt"}}
        assert mgr.verify(0) == sum(v.nbytes for v in arrays.values())

    # Back out to safetensors: one file per process, and the index.
    assert _convert.main([dst, out]) == 0
    if comm.size == 1:
        files = {n: "model.safetensors" for n in arrays}
    else:
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            files = json.load(f)["weight_map"]
        assert len(set(files.values())) == min(comm.size, len(arrays))
    assert sorted(files) == sorted(arrays)
    for name, fn in files.items():
        with safetensors.safe_open(os.path.join(out, fn), framework="pt") as f:
            all_equal_bytes(comm, _sources.torch_to_numpy(f.get_tensor(name)), arrays[name], f"out: {name}")


def test_safetensors_out_fails_on_every_rank_when_one_rank_fails(comm, root):
    """A rank that cannot write its file makes every rank raise the same
    error, naming that rank, instead of leaving the others waiting for it;
    and a failure before the restore (no step to convert) likewise."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from support import raises_everywhere

    src, out = os.path.join(root, "mh"), os.path.join(root, "st")
    mhckpt.CheckpointManager(src).close()
    raises_everywhere(comm, mhckpt.NotFoundError,
                      lambda: _convert.to_safetensors(src, None, out, comm),
                      contains=("no committed step",))
    with mhckpt.CheckpointManager(src) as m:
        m.save(3, {"a": pattern("cvf/a", (8 * comm.size, 3), "float32"),
                   "b": pattern("cvf/b", (5,), "int32"), "v": 7})
    bad = comm.size - 1
    name = ("model.safetensors" if comm.size == 1
            else f"model-{bad + 1:05d}-of-{comm.size:05d}.safetensors")
    if comm.rank == 0:
        os.makedirs(os.path.join(out, name))  # the failing rank's file is a directory
    comm.Barrier()
    raises_everywhere(comm, mhckpt.IoError, lambda: _convert.to_safetensors(src, 3, out, comm),
                      contains=(f"rank {bad}: ", name))
    # The same conversion into a fresh directory works at this world size.
    fresh = os.path.join(root, "st2")
    nbytes, files = _convert.to_safetensors(src, 3, fresh, comm)
    all_ok(comm, comm.allreduce(nbytes) == 8 * comm.size * 3 * 4 + 5 * 4, "bytes written")
    all_ok(comm, all(os.path.isfile(f) for f in files), "every file is there")
