"""Keeping the best checkpoints by a metric, as Orbax's documentation shows it
-- with Orbax or with mhckpt.orbax (``--backend``: only the import changes).

Two managers train the model of ``orbax_train.py`` for 10 steps and save each
step with ``metrics=``, under ``max_to_keep=2``:

- ``accuracy``: ``best_fn=lambda m: m['accuracy']``, ``best_mode='max'``, and
  steps saved without metrics are kept (``keep_checkpoints_without_metrics``);
- ``loss``: ``best_fn=lambda m: m['loss']``, ``best_mode='min'``,
  ``keep_period=4``, and steps without metrics are not kept.

Between equal metrics the later step ranks better; the newest step goes when
it is not among the best. The save phase (``--phase save``) then deletes a
step with ``delete`` and tries two that do not exist. ``--phase resume``
opens the managers again (at another process count), restores
``best_step()`` and saves three more steps. ``--report FILE`` (process 0)
records the steps kept after every save, ``best_step()``, the metrics, what
``delete`` raised and the sha256 of every array saved and restored: the same
for both backends.

    mpirun -np 2 python orbax_best.py --backend mhckpt --ckpt /tmp/best --phase save --report /tmp/a.json
    mpirun -np 3 python orbax_best.py --backend mhckpt --ckpt /tmp/best --phase resume --report /tmp/b.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import jax
import jax.numpy as jnp

from orbax_train import SHAPES, batch_at, fingerprint, init_state, make_train_step, start_job

# Each step's metrics (None: saved without metrics), with ties, and newest
# steps that are not among the best.
ACCURACY = [0.3, 0.6, None, 0.6, 0.5, 0.9, 0.2, None, 0.9, 0.1, 0.95, None, 0.9]
LOSS = [1.0, 0.8, 0.8, None, 0.9, 0.5, None, 0.7, 0.5, 0.6, 0.4, None, 0.45]
SAVE_STEPS, RESUME_STEPS = 10, 13


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("orbax", "mhckpt"), required=True)
    p.add_argument("--ckpt", required=True, help="a directory for the two managers' roots")
    p.add_argument("--phase", choices=("save", "resume"), required=True)
    p.add_argument("--port", type=int, default=12358, help="port of JAX's coordinator on 127.0.0.1")
    p.add_argument("--report", help="process 0 writes what it saw here (JSON)")
    return p.parse_args()


def options_of(ocp, name: str):
    if name == "accuracy":
        return ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["accuracy"], best_mode="max",
                                            keep_checkpoints_without_metrics=True)
    return ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min",
                                        keep_period=4, keep_checkpoints_without_metrics=False)


def metrics_at(name: str, step: int):
    value = (ACCURACY if name == "accuracy" else LOSS)[step]
    return None if value is None else {name: value, "step": step}


def run(ocp, name: str, directory: str, phase: str, shardings, replicated) -> dict:
    """One manager's run; returns its report."""
    train_step = make_train_step(shardings, replicated)
    abstract = {group: {k: jax.ShapeDtypeStruct(SHAPES[k], jnp.float32, sharding=s) for k, s in by_name.items()}
                for group, by_name in shardings.items()}

    def restore(mngr, step):
        got = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                         extra=ocp.args.JsonRestore()))
        return got.state, fingerprint({"state": got.state, "extra": got.extra})

    report = {"saved": {}, "after_save": {}}
    with ocp.CheckpointManager(directory, options=options_of(ocp, name), item_names=("state", "extra")) as mngr:
        report["opened"] = {"steps": mngr.all_steps(), "best": mngr.best_step()}
        if phase == "save":
            state, start, stop = init_state(shardings), 0, SAVE_STEPS
        else:
            best = mngr.best_step()
            state, report["restored_best"] = restore(mngr, best)
            start, stop = SAVE_STEPS, RESUME_STEPS
        for step in range(start, stop):
            x, y = batch_at(step * 32, replicated)
            state, _ = train_step(state, x, y)
            extra = {"step": step, "name": name}
            report["saved"][step] = fingerprint({"state": state, "extra": extra})
            assert mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                           extra=ocp.args.JsonSave(extra)),
                             metrics=metrics_at(name, step))
            report["after_save"][step] = mngr.all_steps()
        mngr.wait_until_finished()
        report["steps"] = mngr.all_steps()
        report["latest"] = mngr.latest_step()
        report["best"] = mngr.best_step()
        report["metrics"] = {s: mngr.metrics(s) for s in report["steps"]}
        _, report["restored_final_best"] = restore(mngr, report["best"])
        if phase == "save":
            # A kept step without metrics, the newest step (dropped: not
            # among the best), and one never saved.
            report["delete"] = {}
            for step in (7, SAVE_STEPS - 1, 100):
                try:
                    mngr.delete(step)
                    report["delete"][step] = ["deleted", mngr.all_steps(), mngr.best_step()]
                except FileNotFoundError as e:
                    report["delete"][step] = ["FileNotFoundError", str(e)]
    return report


def main() -> None:
    args = parse_args()
    ocp, rank, nproc, shardings, replicated = start_job(args.backend, args.port)
    report = {name: run(ocp, name, os.path.join(args.ckpt, name), args.phase, shardings, replicated)
              for name in ("accuracy", "loss")}
    if rank == 0:
        print(f"{args.phase} on {nproc} processes: " +
              "; ".join(f"{n}: steps {r['steps']}, best {r['best']}" for n, r in report.items()), flush=True)
        if args.report:
            with open(args.report, "w") as f:
                json.dump(report, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 -- any failure ends the whole job
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
