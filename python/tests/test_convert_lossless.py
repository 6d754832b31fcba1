"""``python -m mhckpt convert`` without loss: real optimizer states written by
the real libraries, converted at 2 processes and restored at 3 by the drop-ins
with the arguments that restore the original, compared leaf by leaf, bit for
bit, types and tree structure included.

- Orbax: an optax chain (``clip_by_global_norm``, ``adamw`` with a mask and
  bfloat16 moments, a masked ``trace``: ``EmptyState``, ``MaskedState`` and
  ``MaskedNode`` leaves) after a few updates, saved by Orbax's
  ``StandardSave`` as ``{'params', 'opt_state'}``, beside a ``PyTreeSave``
  item of None, empty containers, Python scalars, a string and arrays of
  other dtypes, and a JSON item. ``mhckpt.orbax`` restores the converted step
  at 3 processes with the ``StandardRestore`` / ``PyTreeRestore`` args that
  restore the original under real Orbax (the abstract target built from the
  same optax init, sharded over the 3 processes), and without a target (the
  tree real Orbax gives without one).
- DCP: a torch ``AdamW`` (float32 and bfloat16 parameters) after a few steps,
  ``get_state_dict`` + ``dcp.save``, with non-tensor entries (None, empty
  list and tuple, a string, tuples of scalars and of tensors);
  ``mhckpt.torch.load`` at 3 processes into a fresh model and optimizer, then
  ``set_state_dict``, and one more step compared with the original's.

This module starts its own mpirun jobs (it runs at world size 1 only); run as
a script (``python test_convert_lossless.py orbax|dcp ...``) it is the
restoring job.
"""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys

import numpy as np

STEPS = 3  # optimizer updates before the save


# ------------------------------------------------------------------ optax


def optax_setup(jax):
    """(params, tx): the same on every process (deterministic)."""
    import optax

    jnp = jax.numpy
    params = {
        "dense": {"kernel": jnp.asarray(np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)),
                  "bias": jnp.asarray(np.linspace(0, 1, 4, dtype=np.float32))},
        "emb": jnp.asarray(np.linspace(-2, 2, 27, dtype=np.float32).reshape(9, 3)).astype(jnp.bfloat16),
        "scale": jnp.asarray(1.5, jnp.float32),
    }
    mask = {"dense": {"kernel": True, "bias": False}, "emb": True, "scale": False}
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-2, mu_dtype=jnp.bfloat16, mask=mask),
        optax.masked(optax.trace(decay=0.9), mask),
    )
    return params, tx


def optax_trained(jax):
    import optax

    params, tx = optax_setup(jax)
    opt_state = tx.init(params)

    def loss(p):
        return sum(jax.numpy.sum(jax.numpy.sin(x.astype(jax.numpy.float32)) * (i + 1))
                   for i, x in enumerate(jax.tree.leaves(p)))

    for _ in range(STEPS):
        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return {"params": params, "opt_state": opt_state}


def extra_item():
    """A PyTreeSave item of what is not an array: None, empty containers,
    Python scalars, a string; and numpy arrays of more dtypes."""
    import ml_dtypes

    return {
        "none": None, "empty_dict": {}, "empty_list": [], "empty_tuple": (),
        "nested": [{}, None, (), {"deep": []}],
        "epoch": 3, "lr": 0.25, "done": False, "name": "run-1",
        "ids": np.arange(5, dtype=np.uint16), "u64": np.arange(3, dtype=np.uint64) * (2**40 + 1),
        "i8": np.arange(-3, 3, dtype=np.int8), "f16": np.linspace(0, 1, 4, dtype=np.float16),
        "f64": np.linspace(0, 1, 3, dtype=np.float64), "flags": np.array([True, False, True]),
        "f8": np.linspace(-2, 2, 6, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn),
        "f8b": np.linspace(-2, 2, 6, dtype=np.float32).astype(ml_dtypes.float8_e5m2),
        "i64_0d": np.asarray(np.int64(-7)),
    }


def sharded_abstract(jax, tree):
    """Each array leaf of ``tree`` as a ShapeDtypeStruct over every device:
    rows split where they divide evenly, replicated otherwise."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = len(jax.devices())

    def one(x):
        spec = P("x") if x.ndim and x.shape[0] % n == 0 else P()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))

    return jax.tree.map(one, tree)


# ------------------------------------------------------------- comparison


def _tree_mismatch(jax, got, want, what, jax_arrays=False):
    """None or the first difference: the tree structures (namedtuple types,
    None, empty nodes), each leaf's type, and every byte (each addressable
    shard of a jax.Array against that slice of the reference). ``jax_arrays``:
    the arrays of ``got`` are jax.Arrays (those of ``want``, numpy)."""
    import jax.tree_util as tu

    gs, ws = tu.tree_structure(got), tu.tree_structure(want)
    if gs != ws:
        return f"{what}: tree structure\n  got  {gs}\n  want {ws}"
    for (path, g), w in zip(tu.tree_flatten_with_path(got)[0], tu.tree_leaves(want)):
        name = f"{what}{tu.keystr(path)}"
        if isinstance(w, (np.ndarray, jax.Array)):
            if not (isinstance(g, jax.Array) if jax_arrays else type(g) is type(w)):
                return f"{name}: a {type(g).__qualname__}, not a {'jax.Array' if jax_arrays else type(w)}"
            if g.dtype != w.dtype or g.shape != w.shape:
                return f"{name}: {g.dtype}{g.shape}, not {w.dtype}{w.shape}"
            wn = np.asarray(w)
            parts = [(s.index, s.data) for s in g.addressable_shards] if isinstance(g, jax.Array) \
                else [((), g)]
            for index, data in parts:
                if np.ascontiguousarray(np.asarray(data)).tobytes() != \
                        np.ascontiguousarray(wn[index]).tobytes():
                    return f"{name}: bytes differ at {index}"
        elif type(g) is not type(w) or g != w:
            return f"{name}: {g!r} ({type(g).__name__}), not {w!r} ({type(w).__name__})"
    return None


def _as_numpy(jax, tree):
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


# ---------------------------------------------------- the restoring jobs


def _orbax_job(dst: str, ref_file: str, port: int) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=comm.size, process_id=comm.rank)
    import mhckpt.orbax as mocp

    with open(ref_file, "rb") as f:
        ref = pickle.load(f)
    params, tx = optax_setup(jax)
    # The args that restore the original: the abstract state of the same init.
    abstract = sharded_abstract(jax, jax.eval_shape(lambda: {"params": params, "opt_state": tx.init(params)}))
    extra = ref["extra"]
    errors = []
    with mocp.CheckpointManager(dst, options=mocp.CheckpointManagerOptions(read_only=True)) as mngr:
        got = mngr.restore(ref["step"], args=mocp.args.Composite(
            state=mocp.args.StandardRestore(abstract), extra=mocp.args.PyTreeRestore(extra),
            meta=mocp.args.JsonRestore()))
        errors.append(_tree_mismatch(jax, got.state, ref["state"], "state", jax_arrays=True))
        errors.append(_tree_mismatch(jax, got.extra, ref["extra"], "extra"))
        if got.meta != ref["meta"]:
            errors.append(f"meta: {got.meta!r}, not {ref['meta']!r}")
        whole = mngr.restore(ref["step"])  # no target: the tree real Orbax gives without one
        errors.append(_tree_mismatch(jax, _as_numpy(jax, whole.state), ref["state_no_target"], "no target: state"))
        errors.append(_tree_mismatch(jax, _as_numpy(jax, whole.extra), ref["extra_no_target"], "no target: extra"))
    return _report(comm, errors)


def _dcp_job(dst: str, ref_file: str, port: int) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import mhckpt.torch as mdcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=comm.size)
    ref = torch.load(ref_file, weights_only=False)
    torch.manual_seed(1000 + comm.rank)  # fresh and different from what was saved
    model, opt = torch_setup(torch)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "extra": dcp_extra_like(torch)}
    mdcp.load(state, checkpoint_id=dst)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    errors = [_torch_mismatch(torch, model.state_dict(), ref["model"], "model"),
              _torch_mismatch(torch, opt.state_dict(), ref["optim"], "optimizer"),
              _torch_mismatch(torch, state["extra"], ref["extra"], "extra")]
    # And the optimizer steps on as the original does.
    torch_step(torch, model, opt)
    errors.append(_torch_mismatch(torch, model.state_dict(), ref["model_next"], "model after a step"))
    dist.destroy_process_group()
    return _report(comm, errors)


def _report(comm, errors) -> int:
    errors = [e for e in errors if e]
    every = comm.allgather(errors)
    if comm.rank == 0:
        for r, errs in enumerate(every):
            for e in errs:
                print(f"rank {r}: {e}", flush=True)
        print("restore: " + ("FAILED" if any(every) else "OK"), flush=True)
    return 1 if any(every) else 0


# ------------------------------------------------------------------- torch


def torch_setup(torch):
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    model[2].to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    return model, opt


def torch_step(torch, model, opt):
    x = torch.linspace(-1, 1, 20).reshape(4, 5)
    h = model[1](model[0](x))
    y = model[2](h.to(torch.bfloat16))
    loss = (y.float() ** 2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


def dcp_extra(torch):
    """Non-tensor entries (DCP pickles them), a tuple holding tensors among them."""
    return {"none": None, "empty_list": [], "empty_tuple": (), "name": "run-1", "epoch": 3,
            "pair": (0.5, "a", None), "nested": {"deep": [], "flag": True},
            "tensors": (torch.arange(3, dtype=torch.int16), torch.tensor(0.9, dtype=torch.float64))}


def dcp_extra_like(torch):
    """A state dict to load ``dcp_extra`` into: the same structure, other values."""
    return {"none": 0, "empty_list": [], "empty_tuple": (), "name": "", "epoch": 0,
            "pair": (0.0, "", 0), "nested": {"deep": [], "flag": False},
            "tensors": (torch.zeros(3, dtype=torch.int16), torch.tensor(0.0, dtype=torch.float64))}


def _torch_mismatch(torch, got, want, what):
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
            return f"{what}: {got!r:.200}, not {want.dtype}{tuple(want.shape)}"
        g = got.detach().contiguous().reshape(-1).view(torch.uint8) if got.numel() else got
        w = want.detach().contiguous().reshape(-1).view(torch.uint8) if want.numel() else want
        return None if torch.equal(g, w) else f"{what}: bytes differ"
    if isinstance(want, dict) and isinstance(got, dict):  # an OrderedDict of state_dict() too
        pass
    elif type(got) is not type(want):
        return f"{what}: a {type(got).__name__} ({got!r:.200}), not a {type(want).__name__} ({want!r:.200})"
    if isinstance(want, dict):
        if sorted(got, key=str) != sorted(want, key=str):
            return f"{what}: keys {sorted(got, key=str)}, not {sorted(want, key=str)}"
        for k in want:
            e = _torch_mismatch(torch, got[k], want[k], f"{what}/{k}")
            if e:
                return e
        return None
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{what}: {len(got)} items, not {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            e = _torch_mismatch(torch, g, w, f"{what}/{i}")
            if e:
                return e
        return None
    return None if got == want else f"{what}: {got!r}, not {want!r}"


# ------------------------------------------------------------------- tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _restore_job(kind: str, nproc: int, dst, ref_file) -> str:
    import pytest
    from test_examples import MPIRUN, _mpirun_env, _unpin

    if MPIRUN is None:
        pytest.skip("mpirun not found")
    cmd = [MPIRUN, "-np", str(nproc), "--oversubscribe", "--bind-to", "none",
           "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_vader_single_copy_mechanism", "none",
           sys.executable, os.path.abspath(__file__), kind, str(dst), str(ref_file), str(_free_port())]
    p = subprocess.run(cmd, env=_mpirun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, preexec_fn=_unpin, cwd="/")
    assert p.returncode == 0, f"{kind} restore at {nproc} processes failed ({p.returncode}):\n{p.stdout[-6000:]}"
    return p.stdout


if __name__ != "__main__":
    import pytest

    pytestmark = pytest.mark.skipif(int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1,
                                    reason="starts its own mpirun jobs: runs at world size 1 only")

    def test_optax_adamw_state_converted_without_loss(tmp_path, jax_dist):
        jax = jax_dist.jax
        ocp = pytest.importorskip("orbax.checkpoint")
        pytest.importorskip("optax")
        from test_convert import convert

        state = optax_trained(jax)
        extra = extra_item()
        src, dst = tmp_path / "orbax", tmp_path / "mh"
        with ocp.CheckpointManager(str(src)) as mngr:
            mngr.save(STEPS, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), extra=ocp.args.PyTreeSave(extra),
                meta=ocp.args.JsonSave({"lr": 0.25, "tags": ["a", "b"]})))
            mngr.wait_until_finished()
        # What real Orbax gives back, with the args and without.
        params, tx = optax_setup(jax)
        abstract = sharded_abstract(jax, jax.eval_shape(lambda: {"params": params, "opt_state": tx.init(params)}))
        with ocp.CheckpointManager(str(src)) as mngr:
            orig = mngr.restore(STEPS, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), extra=ocp.args.PyTreeRestore(extra),
                meta=ocp.args.JsonRestore()))
            plain = mngr.restore(STEPS, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(), extra=ocp.args.PyTreeRestore(), meta=ocp.args.JsonRestore()))
        ref_state = jax.device_get(state)
        assert _tree_mismatch(jax, orig.state, ref_state, "orbax: state", jax_arrays=True) is None
        assert _tree_mismatch(jax, orig.extra, extra, "orbax: extra") is None
        ref = {"step": STEPS, "state": ref_state, "extra": extra, "meta": orig.meta,
               "state_no_target": _as_numpy(jax, plain.state), "extra_no_target": _as_numpy(jax, plain.extra)}
        ref_file = tmp_path / "ref.pkl"
        with open(ref_file, "wb") as f:
            pickle.dump(ref, f)

        out = convert(2, str(src), str(dst))
        assert f"step {STEPS}:" in out, out
        _restore_job("orbax", 3, dst, ref_file)

    def test_torch_adamw_state_converted_without_loss(tmp_path):
        torch = pytest.importorskip("torch")
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from test_convert import convert

        torch.manual_seed(0)
        model, opt = torch_setup(torch)
        for _ in range(STEPS):
            torch_step(torch, model, opt)
        msd, osd = get_state_dict(model, opt)
        src, dst = tmp_path / "dcp", tmp_path / "mh"
        dcp.save({"model": msd, "optim": osd, "extra": dcp_extra(torch)}, checkpoint_id=str(src), no_dist=True)
        ref = {"model": {k: v.clone() for k, v in model.state_dict().items()},
               "optim": pickle.loads(pickle.dumps(opt.state_dict())), "extra": dcp_extra(torch)}
        torch_step(torch, model, opt)
        ref["model_next"] = {k: v.clone() for k, v in model.state_dict().items()}
        ref_file = tmp_path / "ref.pt"
        torch.save(ref, ref_file)

        convert(2, str(src), str(dst), "--step", str(STEPS))
        _restore_job("dcp", 3, dst, ref_file)


if __name__ == "__main__":
    kind, dst, ref_file, port = sys.argv[1:5]
    job = {"orbax": _orbax_job, "dcp": _dcp_job}[kind]
    sys.exit(job(dst, ref_file, int(port)))
