"""FSDP2 training with torch.distributed.checkpoint (DCP) -- or mhckpt.torch.

This is plain DCP code: an FSDP2 (``fully_shard``) model and its Adam
optimizer on CPU with gloo, saved with ``dcp.save`` / ``dcp.async_save`` of
``get_state_dict``, and resumed with ``dcp.load`` and ``set_state_dict``.
``--backend mhckpt`` changes one line, the import:

    import torch.distributed.checkpoint as dcp      # --backend dcp
    import mhckpt.torch as dcp                      # --backend mhckpt

Run it under mpirun (mhckpt.torch needs MPI's ranks to be torch's):

    mpirun -np 2 python dcp_train.py --backend mhckpt --ckpt /tmp/run3 --steps 10        # saves 0, 4, 8
    mpirun -np 3 python dcp_train.py --backend mhckpt --ckpt /tmp/run3 --steps 14 --resume

Each save goes to its own directory, CKPT/step_N (DCP's checkpoint_id). The
resumed job shards the model over the new number of processes and loads into
it. ``--fingerprint FILE`` writes the sha256 of every tensor's full global
bytes at the last save and right after the load; they are the same for both
backends and any process counts.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

D_IN, HIDDEN, D_OUT, BATCH = 24, 20, 3, 32  # 20 and 3 rows: uneven shards over 3 processes


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("dcp", "mhckpt"), required=True)
    p.add_argument("--ckpt", required=True, help="checkpoint directory (shared by all ranks)")
    p.add_argument("--steps", type=int, default=10, help="train until this step")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--resume", action="store_true", help="load the latest step first")
    p.add_argument("--async-save", action="store_true", help="dcp.async_save instead of dcp.save")
    p.add_argument("--port", type=int, default=29513, help="port of torch.distributed's store on 127.0.0.1")
    p.add_argument("--fingerprint", help="rank 0 writes the fingerprints here (JSON)")
    return p.parse_args()


def make_model(mesh) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial values at every world size
    model = torch.nn.Sequential(torch.nn.Linear(D_IN, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, D_OUT))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch_at(position: int):
    g = torch.Generator().manual_seed(position)
    x = torch.randn(BATCH, D_IN, generator=g)
    return x, torch.sin(x[:, :D_OUT])


def fingerprint(tree, prefix: str = "") -> dict:
    """sha256 of every tensor's full global bytes (DTensors gathered from all
    ranks), and the plain values as they are. Collective."""
    out = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, leaf in sorted(items, key=lambda kv: str(kv[0])):
        name = f"{prefix}{key}"
        if isinstance(leaf, (dict, list, tuple)):
            out.update(fingerprint(leaf, name + "/"))
        elif isinstance(leaf, torch.Tensor):
            full = leaf.full_tensor() if isinstance(leaf, DTensor) else leaf
            full = full.detach().contiguous()
            digest = hashlib.sha256(full.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            out[name] = f"{str(full.dtype).removeprefix('torch.')}{list(full.shape)} {digest}"
        else:
            out[name] = leaf
    return out


def latest_step(ckpt: str):
    steps = [int(n[5:]) for n in os.listdir(ckpt) if n.startswith("step_")] if os.path.isdir(ckpt) else []
    return max(steps) if steps else None


def main() -> None:
    args = parse_args()
    if args.backend == "dcp":
        import torch.distributed.checkpoint as dcp
    else:
        import mhckpt.torch as dcp

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    # DCP's async_save runs its collectives on a thread beside training's:
    # they need a process group of their own.
    ckpt_group = dist.new_group(backend="gloo") if args.async_save else None
    model = make_model(mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    report = {"world_size": world}
    start, position = 0, 0
    if args.resume:
        step = latest_step(args.ckpt)
        if step is None:
            raise SystemExit(f"--resume: no checkpoint in {args.ckpt}")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "step": 0, "data": {"position": 0}}
        dcp.load(state, checkpoint_id=os.path.join(args.ckpt, f"step_{step}"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start, position = state["step"], state["data"]["position"]
        report["restored"] = fingerprint(dict(zip(("model", "optim"), get_state_dict(model, optimizer))))
        log(f"restored step {start} on {world} processes; data position {position}")

    pending = None
    for step in range(start, args.steps):
        if step % args.save_every == 0 and not (args.resume and step == start):
            if pending is not None:
                pending.result()
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd, "step": step, "data": {"position": position}}
            report["saved"] = fingerprint({"model": model_sd, "optim": optim_sd})
            checkpoint_id = os.path.join(args.ckpt, f"step_{step}")
            if args.async_save:
                pending = dcp.async_save(state, checkpoint_id=checkpoint_id, process_group=ckpt_group)
            else:
                dcp.save(state, checkpoint_id=checkpoint_id)
            log(f"step {step}: saved")
        x, y = batch_at(position)
        position += BATCH
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()  # overwrites the parameters and Adam's state in place
        optimizer.zero_grad()
        log(f"step {step}: loss {loss.item():.6f}")
    if pending is not None:
        pending.result()
    log(f"done: {args.steps} steps on {world} processes")
    if args.fingerprint and rank == 0:
        with open(args.fingerprint, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 -- any failure ends the whole job
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
