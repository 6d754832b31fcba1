"""Multi-process PyTorch (DTensor) training with asynchronous mhckpt checkpoints.

The parameters are DTensors on a 1-d DeviceMesh over all ranks, one of each
placement mhckpt maps to boxes of a global array:

    w1  [24, 16]  Shard(0)     rows split over the ranks
    w2  [16, 10]  Shard(1)     columns split (10 over 3 ranks is uneven: 4, 4, 2)
    b2  [10]      Replicate()  every rank holds all of it

Adam keeps two more DTensors per parameter (exp_avg, exp_avg_sq, with the
parameter's placements) and a plain tensor ``step``. The training loop saves
the model and the optimizer state asynchronously, runs the forward and
backward passes, and calls ``optimizer.step()``, which overwrites all of them
*in place*: the checkpoint still holds the values of the save, because
``save`` copied them first (with ``--lazy``, because the loop waits on the
save's fence just before ``optimizer.step()``).

    mpirun -np 2 python torch_train.py --ckpt /tmp/run2 --steps 10          # saves 0, 4, 8
    mpirun -np 2 python torch_train.py --ckpt /tmp/run3 --steps 10 --lazy   # lazy saves
    mpirun -np 3 python torch_train.py --ckpt /tmp/run2 --steps 14 --resume

The resumed job builds the model and the optimizer state on the new mesh and
restores into them in place. ``--fingerprint FILE`` writes the sha256 of every
tensor's full global bytes at the last save and right after the restore.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import mhckpt

D_IN, HIDDEN, D_OUT, BATCH = 24, 16, 10, 32


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint directory (shared by all ranks)")
    p.add_argument("--steps", type=int, default=10, help="train until this step")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--resume", action="store_true", help="restore the latest step first")
    p.add_argument("--port", type=int, default=29511, help="port of torch.distributed's store on 127.0.0.1")
    p.add_argument("--fingerprint", help="rank 0 writes the fingerprints here (JSON)")
    p.add_argument("--lazy", action="store_true",
                   help="lazy saves: save returns before copying; the loop waits on the fence "
                        "just before optimizer.step()")
    return p.parse_args()


# ------------------------------------------------------------------- the model

def make_params(mesh) -> dict:
    """The three parameters, the same values on every world size."""
    g = torch.Generator().manual_seed(0)
    full = {
        "w1": torch.randn(D_IN, HIDDEN, generator=g) / D_IN**0.5,
        "w2": torch.randn(HIDDEN, D_OUT, generator=g) / HIDDEN**0.5,
        "b2": torch.zeros(D_OUT),
    }
    placements = {"w1": [Shard(0)], "w2": [Shard(1)], "b2": [Replicate()]}
    return {k: torch.nn.Parameter(distribute_tensor(v, mesh, placements[k])) for k, v in full.items()}


def forward(params: dict, x: DTensor) -> DTensor:
    return torch.tanh(x @ params["w1"]) @ params["w2"] + params["b2"]


def batch_at(position: int, mesh):
    """Deterministic data: the batch that starts at sample ``position``, replicated."""
    g = torch.Generator().manual_seed(position)
    x = torch.randn(BATCH, D_IN, generator=g)
    y = torch.sin(x[:, :D_OUT] * 2)
    return (distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(y, mesh, [Replicate()]))


def optimizer_state(optimizer: torch.optim.Optimizer, params: dict) -> dict:
    """Adam's per-parameter state as a dict by parameter name: a pytree of
    tensors (the same objects the optimizer updates in place)."""
    return {name: optimizer.state[p] for name, p in params.items()}


def init_optimizer_state(optimizer: torch.optim.Adam, params: dict) -> None:
    """Creates Adam's state as its first step would (zeros, with each
    parameter's placements), so that every checkpoint holds the same arrays
    and a restore has tensors to fill."""
    for p in params.values():
        optimizer.state[p] = {
            "step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }


# ------------------------------------------------------------- fingerprints

def fingerprint(tree: dict, prefix: str = "") -> dict:
    """sha256 of every tensor's full global bytes (DTensors gathered from
    all ranks), and the plain values as they are. Collective."""
    out = {}
    for key in sorted(tree):
        name, leaf = prefix + key, tree[key]
        if isinstance(leaf, dict):
            out.update(fingerprint(leaf, name + "/"))
        elif isinstance(leaf, torch.Tensor):
            full = leaf.full_tensor() if isinstance(leaf, DTensor) else leaf
            full = full.detach().contiguous()
            digest = hashlib.sha256(full.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            out[name] = f"{str(full.dtype).removeprefix('torch.')}{list(full.shape)} {digest}"
        else:
            out[name] = leaf
    return out


# ------------------------------------------------------------------ training

def main() -> None:
    args = parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    params = make_params(mesh)
    optimizer = torch.optim.Adam(params.values(), lr=0.01)
    init_optimizer_state(optimizer, params)
    report = {"world_size": world}

    # Collective over MPI's world: every rank opens the same directory.
    with mhckpt.CheckpointManager(args.ckpt, max_to_keep=2) as ckpt:
        start, position = 0, 0
        if args.resume:
            step = ckpt.latest_step()
            if step is None:
                raise SystemExit(f"--resume: no committed checkpoint in {args.ckpt}")
            # The target holds this world size's DTensors: restore fills their
            # local shards in place. Plain values take any placeholder.
            target = {"model": params, "optimizer": optimizer_state(optimizer, params),
                      "step": 0, "data": {"position": 0}}
            restored = ckpt.restore(step, target)
            start, position = restored["step"], restored["data"]["position"]
            report["restored"] = fingerprint(restored)
            log(f"restored step {start} on {world} ranks (saved on "
                f"{ckpt.describe(step)['world_size']}); data position {position}")
        elif ckpt.latest_step() is not None:
            raise SystemExit(f"{args.ckpt} has checkpoints: pass --resume or use a new directory")

        for step in range(start, args.steps):
            fence = None
            if step % args.save_every == 0 and not (args.resume and step == start):
                saved = {"model": params, "optimizer": optimizer_state(optimizer, params),
                         "step": step, "data": {"position": position}}
                report["saved"] = fingerprint(saved)
                # Returns once copied (lazy: before copying; the copy runs
                # during the forward and backward passes, which only read the
                # saved tensors). The write goes on in the background.
                fence = ckpt.save(step, saved, lazy=args.lazy)
                log(f"step {step}: save started")

            x, y = batch_at(position, mesh)
            loss = torch.mean((forward(params, x) - y) ** 2)
            optimizer.zero_grad()
            loss.backward()

            if fence is not None:
                fence.wait()  # copied: optimizer.step() may now overwrite the saved tensors
            optimizer.step()  # overwrites params, exp_avg, exp_avg_sq and step in place
            position += BATCH
            log(f"step {step}: loss {loss.full_tensor().item():.6f}")

        ckpt.wait_until_finished()  # the last save is committed (or raises)
    log(f"done: {args.steps} steps on {world} ranks")

    if args.fingerprint and rank == 0:
        with open(args.fingerprint, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    for what in ("saved", "restored"):
        for name, fp in report.get(what, {}).items():
            log(f"fingerprint {what} {name}: {fp}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
