"""Multi-process JAX training with Orbax checkpoints -- or mhckpt.orbax.

This is plain Orbax code. ``--backend mhckpt`` changes one line, the import:

    import orbax.checkpoint as ocp      # --backend orbax
    import mhckpt.orbax as ocp          # --backend mhckpt

Two styles of Orbax code:

- ``--style args`` (Orbax today): ``CheckpointManager(directory, options=...)``,
  ``save(step, args=ocp.args.Composite(state=StandardSave(...), meta=JsonSave(...)))``,
  ``restore(step, args=ocp.args.Composite(state=StandardRestore(abstract), ...))``;
- ``--style legacy`` (the seed's era): ``CheckpointManager(directory,
  ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler()), options)``,
  ``save(step, items, save_kwargs={'save_args': ...})`` with
  ``SaveArgs(aggregate=True)`` for every replicated array (as
  ``flax.training.orbax_utils.save_args_from_target`` gives), and
  ``restore(step, items=..., restore_kwargs={'restore_args': ...})``.

Either way the loop saves asynchronously and at once runs a jitted update that
donates the state it just saved. Run it with one JAX process per MPI rank:

    mpirun -np 2 python orbax_train.py --backend mhckpt --ckpt /tmp/run4 --steps 10     # saves 0, 4, 8
    mpirun -np 3 python orbax_train.py --backend mhckpt --ckpt /tmp/run4 --steps 14 --resume

``--fingerprint FILE`` writes the sha256 of every array's full global bytes at
the last save and right after the restore: the same for both backends and any
process counts.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

jax.config.update("jax_cpu_collectives_implementation", "gloo")

D_IN, HIDDEN, BATCH = 24, 16, 32  # D_IN divides evenly over 1, 2, 3, 4 and 6 processes
SHAPES = {"w1": (D_IN, HIDDEN), "w2": (HIDDEN,), "b": ()}
LEARNING_RATE, MOMENTUM = 0.05, 0.9


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("orbax", "mhckpt"), required=True)
    p.add_argument("--style", choices=("args", "legacy"), default="args")
    p.add_argument("--ckpt", required=True, help="checkpoint directory (shared by all processes)")
    p.add_argument("--steps", type=int, default=10, help="train until this step")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--resume", action="store_true", help="restore the latest step first")
    p.add_argument("--port", type=int, default=12357, help="port of JAX's coordinator on 127.0.0.1")
    p.add_argument("--fingerprint", help="process 0 writes the fingerprints here (JSON)")
    return p.parse_args()


def make_shardings(mesh: Mesh) -> dict:
    """w1 is split by rows over the processes; everything else is replicated."""
    rows, rep = NamedSharding(mesh, P("d", None)), NamedSharding(mesh, P())
    params = {"w1": rows, "w2": rep, "b": rep}
    return {"params": params, "momentum": dict(params)}


def global_array(full: np.ndarray, sharding: NamedSharding) -> jax.Array:
    return jax.make_array_from_callback(full.shape, sharding, lambda index: full[index])


def init_state(shardings: dict) -> dict:
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal(SHAPES["w1"], dtype=np.float32) / np.sqrt(D_IN),
        "w2": rng.standard_normal(SHAPES["w2"], dtype=np.float32) / np.sqrt(HIDDEN),
        "b": np.zeros(SHAPES["b"], np.float32),
    }
    return {
        "params": {k: global_array(v, shardings["params"][k]) for k, v in params.items()},
        "momentum": {k: global_array(np.zeros_like(v), shardings["momentum"][k]) for k, v in params.items()},
    }


def batch_at(position: int, replicated: NamedSharding):
    rng = np.random.default_rng(position)
    x = rng.standard_normal((BATCH, D_IN), dtype=np.float32)
    y = np.sin(x[:, :4].sum(axis=1)).astype(np.float32)
    return global_array(x, replicated), global_array(y, replicated)


def make_train_step(shardings: dict, replicated: NamedSharding):
    @functools.partial(jax.jit, donate_argnums=0, out_shardings=(shardings, replicated))
    def train_step(state, x, y):
        def loss_fn(p):
            pred = jnp.tanh(x @ p["w1"]) @ p["w2"] + p["b"]
            return jnp.mean((pred - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        momentum = jax.tree.map(lambda m, g: MOMENTUM * m + g, state["momentum"], grads)
        params = jax.tree.map(lambda p, m: p - LEARNING_RATE * m, state["params"], momentum)
        return {"params": params, "momentum": momentum}, loss

    return train_step


def fingerprint(tree) -> dict:
    """sha256 of every array's full global bytes; plain values as they are. Collective."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        if isinstance(leaf, jax.Array):
            full = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
            out[name] = f"{full.dtype}{list(full.shape)} " + hashlib.sha256(full.tobytes()).hexdigest()
        else:
            out[name] = leaf.item() if isinstance(leaf, np.generic) else leaf
    return out


def start_job(backend: str, port: int):
    """Imports the backend's ``ocp`` and starts this JAX process (one per MPI
    rank). Returns (ocp, rank, number of processes, the state's shardings,
    the replicated sharding)."""
    if backend == "orbax":
        import orbax.checkpoint as ocp
    else:
        import mhckpt.orbax as ocp

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    nproc = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=rank)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    return ocp, rank, nproc, make_shardings(mesh), NamedSharding(mesh, P())


def main() -> None:
    args = parse_args()
    ocp, rank, nproc, shardings, replicated = start_job(args.backend, args.port)
    train_step = make_train_step(shardings, replicated)

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    options = ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=args.save_every)
    if args.style == "args":
        mngr = ocp.CheckpointManager(args.ckpt, options=options)
    else:
        mngr = ocp.CheckpointManager(args.ckpt, ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler()), options)

    report = {"processes": nproc}
    with mngr:
        start, position = 0, 0
        if args.resume:
            step = mngr.latest_step()
            abstract = {group: {k: jax.ShapeDtypeStruct(SHAPES[k], jnp.float32, sharding=s)
                                for k, s in by_name.items()}
                        for group, by_name in shardings.items()}
            if args.style == "args":
                restored = mngr.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
                state, position = restored.state, restored.meta["position"]
            else:
                target = {"state": abstract, "position": 0}
                restore_args = ocp.checkpoint_utils.construct_restore_args(target)
                restored = mngr.restore(step, items=target, restore_kwargs={"restore_args": restore_args})
                state, position = restored["state"], int(restored["position"])
            start = step
            report["restored"] = fingerprint({"state": state, "position": position})
            log(f"restored step {start} on {nproc} processes; data position {position}")
        else:
            state = init_state(shardings)

        for step in range(start, args.steps):
            if not (args.resume and step == start) and mngr.should_save(step):
                report["saved"] = fingerprint({"state": state, "position": position})
                if args.style == "args":
                    mngr.save(step, args=ocp.args.Composite(
                        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"position": position})))
                else:
                    items = {"state": state, "position": position}
                    # What flax.training.orbax_utils.save_args_from_target gives:
                    # aggregate=True for every array that is not sharded.
                    save_args = jax.tree.map(
                        lambda x: ocp.SaveArgs(
                            aggregate=not isinstance(x, jax.Array) or x.is_fully_replicated),
                        items)
                    mngr.save(step, items, save_kwargs={"save_args": save_args})
                log(f"step {step}: save started")
            x, y = batch_at(position, replicated)
            position += BATCH
            state, loss = train_step(state, x, y)  # donates the arrays just saved
            log(f"step {step}: loss {float(loss):.6f}")
        mngr.wait_until_finished()
    log(f"done: {args.steps} steps on {nproc} processes")
    if args.fingerprint and rank == 0:
        with open(args.fingerprint, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 -- any failure ends the whole job
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
