"""Multi-process JAX training with asynchronous mhckpt checkpoints.

This is the scenario that crashed an Orbax user (see docs/PYTHON.md): an async
save returns, the training loop at once runs a jitted update that *donates* the
state, and a background thread that still reads the replicated arrays lazily
dies with ``RuntimeError: Array has been deleted``. mhckpt copies every local
buffer to host memory before ``save`` returns, so the loop below may donate
(and even ``.delete()``) everything it just saved.

Run it with one JAX process per MPI rank (CPU devices, gloo collectives):

    mpirun -np 2 python jax_train.py --ckpt /tmp/run1 --steps 10     # saves 0, 4, 8
    mpirun -np 2 python jax_train.py --ckpt /tmp/run2 --steps 10 --lazy   # lazy saves
    mpirun -np 3 python jax_train.py --ckpt /tmp/run1 --steps 14 --resume

The resumed job restores the latest step onto 3 processes (a new mesh, new
shardings) and goes on. ``--fingerprint FILE`` writes the sha256 of every
array's full global bytes at the last save and right after the restore: they
are equal, bit for bit, whatever the process counts.

``--naive-async`` swaps mhckpt for a small lazy writer that makes the seed's
mistake and fails with JAX's "Array has been deleted".

Saving at every step, and preemption (a scheduler's notice: Slurm's
``--signal=USR1@60``, a spot VM's SIGTERM):

    mpirun -np 2 python jax_train.py --ckpt /tmp/run3 --steps 1000 --save-every 1 --lazy \
        --local-dir /dev/shm/run3 --persistent-every 100 --preemption --grace 60

``--save-every 1 --lazy`` saves every step while the next batch loads;
``--local-dir`` keeps those saves in node-local memory, and every
``--persistent-every``-th in ``--ckpt``. ``--preemption`` turns SIGTERM and
SIGUSR1 into a notice: the processes agree on a step one or two steps later
(``reached_preemption``), save it to ``--ckpt`` (not only the local tier: the
nodes may not come back), wait for its commit, print "preempted at step N"
and exit 0; ``--resume`` goes on from it at any process count.
``--preempt-at STEP`` sends the last process a SIGUSR1 during that step, as a
scheduler would (for tests).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import mhckpt

# Must be set before JAX starts its CPU backend: cross-process collectives on
# CPU go through gloo.
jax.config.update("jax_cpu_collectives_implementation", "gloo")

D_IN, HIDDEN, BATCH = 24, 16, 32  # D_IN divides evenly over 1, 2, 3, 4 and 6 processes
SHAPES = {"w1": (D_IN, HIDDEN), "w2": (HIDDEN,), "b": ()}
LEARNING_RATE, MOMENTUM = 0.05, 0.9


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint directory (shared by all processes)")
    p.add_argument("--steps", type=int, default=10, help="train until this step")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--resume", action="store_true", help="restore the latest step first")
    p.add_argument("--lazy", action="store_true",
                   help="lazy saves: save returns before copying; the loop waits on the fence "
                        "just before the step that donates the state")
    p.add_argument("--naive-async", action="store_true",
                   help="use the lazy background writer of the seed bug instead of mhckpt")
    p.add_argument("--port", type=int, default=12355, help="port of JAX's coordinator on 127.0.0.1")
    p.add_argument("--fingerprint", help="process 0 writes the fingerprints here (JSON)")
    p.add_argument("--local-dir", help="the local tier: a node-local directory (e.g. under /dev/shm)")
    p.add_argument("--persistent-every", type=int, default=1,
                   help="with --local-dir: every Nth save also goes to --ckpt")
    p.add_argument("--preemption", action="store_true",
                   help="SIGTERM and SIGUSR1 are preemption notices: save the agreed step and exit")
    p.add_argument("--grace", type=float, default=0.0,
                   help="with --preemption: the scheduler's grace period in seconds, for the record")
    p.add_argument("--preempt-at", type=int,
                   help="with --preemption: the last process gets a SIGUSR1 during this step")
    args = p.parse_args()
    if args.preempt_at is not None and not args.preemption:
        p.error("--preempt-at needs --preemption")
    return args


# ------------------------------------------------------------------- the model

def make_shardings(mesh: Mesh) -> dict:
    """w1 is split by rows over the processes; everything else is replicated."""
    rows, rep = NamedSharding(mesh, P("d", None)), NamedSharding(mesh, P())
    params = {"w1": rows, "w2": rep, "b": rep}
    return {"params": params, "momentum": dict(params)}


def global_array(full: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global jax.Array from a numpy array every process holds whole: each
    process fills only its own shards."""
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
        "momentum": {k: global_array(np.zeros_like(v), shardings["momentum"][k])
                     for k, v in params.items()},
    }


def batch_at(position: int, replicated: NamedSharding):
    """Deterministic data: the batch that starts at sample ``position``."""
    rng = np.random.default_rng(position)
    x = rng.standard_normal((BATCH, D_IN), dtype=np.float32)
    y = np.sin(x[:, :4].sum(axis=1)).astype(np.float32)
    return global_array(x, replicated), global_array(y, replicated)


def make_train_step(shardings: dict, replicated: NamedSharding):
    # donate_argnums=0: XLA reuses the state's buffers for the new state, so
    # the arrays passed in are deleted when the call returns.
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


# ------------------------------------------------------------- fingerprints

def fingerprint(tree) -> dict:
    """sha256 of every array's full global bytes (gathered from all
    processes), and the plain values as they are. Collective."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        if isinstance(leaf, jax.Array):
            full = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
            out[name] = f"{full.dtype}{list(full.shape)} " + hashlib.sha256(full.tobytes()).hexdigest()
        else:
            out[name] = leaf
    return out


# ----------------------------------------- the seed bug, without Orbax

class NaiveAsyncCheckpointer:
    """What went wrong, in miniature. ``save`` copies the *sharded* arrays to
    host before returning (Orbax does too), but leaves the fully *replicated*
    ones to a background thread, which reads them with ``np.asarray`` after
    ``save`` has returned -- by then the training loop has donated them."""

    def __init__(self, root: str):
        self.root, self.thread, self.error = root, None, None

    def save(self, step: int, tree: dict) -> None:
        self.wait_until_finished()
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
        eager, lazy = {}, {}
        for path, leaf in flat:
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            if isinstance(leaf, jax.Array) and not leaf.is_fully_replicated:
                for i, shard in enumerate(leaf.addressable_shards):
                    eager[f"{name}#{i}"] = np.asarray(shard.data)  # a host copy, now
            elif isinstance(leaf, jax.Array):
                lazy[name] = leaf  # the mistake: a reference, not a copy

        def write():
            try:
                # A busy writer (a slow file system, earlier saves): by the time it
                # gets to the replicated arrays, the training loop has donated them.
                # Waiting for that, not for a fixed time, makes it happen on every
                # process however loaded the machine is.
                deadline = time.monotonic() + 60
                while not any(x.is_deleted() for x in lazy.values()) and time.monotonic() < deadline:
                    time.sleep(0.01)
                host = dict(eager)
                host.update({name: np.asarray(x) for name, x in lazy.items()})  # "Array has been deleted"
                path = os.path.join(self.root, f"naive_{step}_process{jax.process_index()}.npz")
                np.savez(path, **host)
            except Exception as e:  # noqa: BLE001 -- handed to the training loop
                self.error = e

        self.thread = threading.Thread(target=write, name=f"naive-save-{step}")
        self.thread.start()

    def wait_until_finished(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            raise RuntimeError(f"naive async checkpoint failed: {self.error}") from self.error

    def __enter__(self):
        os.makedirs(self.root, exist_ok=True)
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.wait_until_finished()


# ------------------------------------------------------------------ training

def main() -> None:
    args = parse_args()
    # One JAX process per MPI rank; mpirun tells each its rank.
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    nproc = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=nproc, process_id=rank)

    mesh = Mesh(np.array(jax.devices()), ("d",))  # one CPU device per process
    shardings = make_shardings(mesh)
    replicated = NamedSharding(mesh, P())
    train_step = make_train_step(shardings, replicated)

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    report = {"processes": nproc}
    if args.naive_async and args.resume:
        raise SystemExit("--naive-async writes nothing that --resume could read")
    if args.naive_async:
        ckpt = NaiveAsyncCheckpointer(args.ckpt)
    else:
        # Collective over MPI's world: every process opens the same directory.
        # The save policy: every --save-every steps, and the preemption step.
        ckpt = mhckpt.CheckpointManager(
            args.ckpt, max_to_keep=2, local_dir=args.local_dir, persistent_every=args.persistent_every,
            save_interval_steps=args.save_every, preemption=args.preemption,
            preemption_grace_seconds=args.grace)

    with ckpt:
        start, position, preempted = 0, 0, False
        if args.resume:
            step = ckpt.latest_step()
            if step is None:
                raise SystemExit(f"--resume: no committed checkpoint in {args.ckpt}")
            # The target names what to build: shape, dtype and the *new* mesh's
            # sharding for arrays; any placeholder for plain values.
            target = {
                "state": {group: {k: jax.ShapeDtypeStruct(SHAPES[k], jnp.float32, sharding=s)
                                  for k, s in by_name.items()}
                          for group, by_name in shardings.items()},
                "step": 0,
                "data": {"position": 0},
            }
            restored = ckpt.restore(step, target)
            state, start, position = restored["state"], restored["step"], restored["data"]["position"]
            report["restored"] = fingerprint(restored)
            log(f"restored step {start} on {nproc} processes (saved on "
                f"{ckpt.describe(step)['world_size']}); data position {position}")
        else:
            if not args.naive_async and ckpt.latest_step() is not None:
                raise SystemExit(f"{args.ckpt} has checkpoints: pass --resume or use a new directory")
            state = init_state(shardings)

        for step in range(start, args.steps):
            fence, preempted = None, False
            if args.naive_async:
                save_now = step % args.save_every == 0
            else:
                if step == args.preempt_at and rank == nproc - 1:
                    os.kill(os.getpid(), signal.SIGUSR1)  # as a scheduler would, to one process
                # Collective, once per step, without blocking: the same answers everywhere.
                save_now = ckpt.should_save(step)
                preempted = ckpt.reached_preemption(step)
            if save_now and not (args.resume and step == start):
                saved = {"state": state, "step": step, "data": {"position": position}}
                report["saved"] = fingerprint(saved)  # before the arrays go away
                # The preemption step goes to --ckpt too: the nodes may not come back.
                kw = {"tier": "persistent"} if preempted and args.local_dir else {}
                if args.lazy and not preempted:
                    # Returns before copying: the copy runs while the batch loads.
                    fence = ckpt.save(step, saved, lazy=True, **kw)
                else:
                    ckpt.save(step, saved, **kw)  # returns once copied: the write goes on
                log(f"step {step}: save started")
            if preempted:
                t = time.perf_counter()
                ckpt.wait_until_finished()  # committed on every process (or raises)
                record = ckpt.describe(step)["preemption"]
                log(f"preempted at step {step}: saved in {time.perf_counter() - t:.3f} s "
                    f"({record['saved_after_seconds']:.3f} s after the notice)")
                break

            x, y = batch_at(position, replicated)
            position += BATCH
            if fence is not None:
                fence.wait()  # the state is copied: the next line may donate it
            old = state
            state, loss = train_step(state, x, y)  # donates every array of `old` ...
            for a in jax.tree.leaves(old):
                if not a.is_deleted():  # ... and whatever a backend did not donate goes too
                    a.delete()
            log(f"step {step}: loss {float(loss):.6f}")

        ckpt.wait_until_finished()  # the last save is committed (or raises)
    if not preempted:
        log(f"done: {args.steps} steps on {nproc} processes")

    if args.fingerprint and rank == 0:
        with open(args.fingerprint, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    for what in ("saved", "restored"):
        for name, fp in report.get(what, {}).items():
            log(f"fingerprint {what} {name}: {fp}")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 -- any failure ends the whole job
        # Exit at once: a normal exit runs jax.distributed's shutdown, which waits
        # for processes that may still be in a collective with this one, and
        # mpirun ends the job only when a process has exited.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
