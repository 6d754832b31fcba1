"""The examples in python/examples, run end to end as mpirun jobs.

Each example writes the sha256 of every array's full global bytes at its last
save and right after a restore (``--fingerprint``); a resume at another
process count must give back exactly the bytes saved. The seed's bug is shown
too: the lazy background writer of ``jax_train.py --naive-async`` dies with
JAX's "Array has been deleted", where the mhckpt run of the same loop passes.

This module starts its own mpirun jobs, so it runs at world size 1 only (plain
``pytest``, or ``mpirun -np 1``) and skips itself at larger world sizes.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1,
    reason="starts its own mpirun jobs: runs at world size 1 only",
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MPIRUN = shutil.which("mpirun")
JOB_TIMEOUT_S = 180  # one mpirun job; a hang fails the test instead of stalling the suite


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mpirun_env() -> dict:
    """This environment without the variables of an enclosing mpirun (a
    nested mpirun would take them for its own), plus what the jobs need."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_", "PRTE_"))}
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def _unpin() -> None:
    # An enclosing `mpirun -np 1` binds this process to one core, and the job's
    # ranks would inherit that: let them use every core again.
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


def run_example(script: str, nproc: int, *args: str) -> subprocess.CompletedProcess:
    """``mpirun -np nproc python examples/script args --port P`` with this
    test's interpreter; returns the finished process (stdout + stderr)."""
    if MPIRUN is None:
        pytest.skip("mpirun not found")
    cmd = [MPIRUN, "-np", str(nproc), "--oversubscribe", "--bind-to", "none",
           "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_vader_single_copy_mechanism", "none",
           sys.executable, str(EXAMPLES / script), *args, "--port", str(_free_port())]
    return subprocess.run(cmd, env=_mpirun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=JOB_TIMEOUT_S, preexec_fn=_unpin)


def run_ok(script: str, nproc: int, *args: str) -> str:
    p = run_example(script, nproc, *args)
    assert p.returncode == 0, f"{script} at {nproc} processes failed ({p.returncode}):\n{p.stdout[-4000:]}"
    return p.stdout


def train_and_resume(script: str, tmp_path: Path, world_sizes, n_arrays: int, save_every: int = 4,
                     first_args=()):
    """Trains at world_sizes[0] (with ``first_args``), then resumes at each
    next world size for 4 more steps; checks after each resume that the
    restored fingerprints (``n_arrays`` arrays and the values) are the ones of
    the last save before it."""
    ckpt = tmp_path / "ckpt"
    steps = 10
    previous = None
    for i, n in enumerate(world_sizes):
        fp_file = tmp_path / f"fingerprint{i}.json"
        args = ["--ckpt", str(ckpt), "--steps", str(steps), "--save-every", str(save_every),
                "--fingerprint", str(fp_file)]
        out = run_ok(script, n, *args, *(["--resume"] if previous else list(first_args)))
        fp = json.loads(fp_file.read_text())
        if previous:
            assert f"restored step {previous['saved']['step']} on {n}" in out
            assert fp["restored"] == previous["saved"], (
                f"{script}: restored at {n} processes differs from saved at {world_sizes[i - 1]}"
            )
        # The last save of this run: a whole step of arrays and the values beside them.
        assert fp["saved"]["step"] == (steps - 1) // save_every * save_every
        assert fp["saved"]["data/position"] == fp["saved"]["step"] * 32
        hashed = [k for k, v in fp["saved"].items() if str(v).startswith("float32[")]
        assert len(hashed) == n_arrays, fp["saved"]
        previous = fp
        steps += 4


def test_jax_resume_at_other_process_counts(tmp_path):
    """Trained at 2 with lazy saves (the fence waited on right before the
    jitted step that donates the state), resumed at 3 and 1 with blocking
    ones; every resume restores what the run before it saved, bit for bit."""
    pytest.importorskip("jax")
    train_and_resume("jax_train.py", tmp_path, [2, 3, 1], n_arrays=6,  # params, momentum
                     first_args=["--lazy"])


def test_jax_preemption_then_resume(tmp_path):
    """Saves at every step, lazily, into a local tier (every 4th also to the
    root); a SIGUSR1 to one process during step 5: both agree on step 6 or
    7, save it to the root and exit 0; a job of 3 resumes from it, bit for
    bit."""
    pytest.importorskip("jax")
    ckpt, first, second = tmp_path / "ckpt", tmp_path / "save.json", tmp_path / "resume.json"
    out = run_ok("jax_train.py", 2, "--ckpt", str(ckpt), "--steps", "40", "--save-every", "1", "--lazy",
                 "--local-dir", str(tmp_path / "local"), "--persistent-every", "4",
                 "--preemption", "--grace", "30", "--preempt-at", "5", "--fingerprint", str(first))
    saved = json.loads(first.read_text())["saved"]
    step = saved["step"]
    assert step in (6, 7) and f"preempted at step {step}: saved in" in out, out[-4000:]
    assert "done: 40 steps" not in out
    out = run_ok("jax_train.py", 3, "--ckpt", str(ckpt), "--steps", str(step + 2), "--resume",
                 "--fingerprint", str(second))
    assert f"restored step {step} on 3" in out, out[-4000:]
    assert json.loads(second.read_text())["restored"] == saved


def test_jax_naive_async_writer_reads_deleted_arrays(tmp_path):
    """The loop that passes with mhckpt above, with a lazy writer instead."""
    pytest.importorskip("jax")
    p = run_example("jax_train.py", 2, "--ckpt", str(tmp_path / "naive"), "--steps", "6", "--naive-async")
    assert p.returncode != 0, p.stdout[-4000:]
    assert "naive async checkpoint failed: Array has been deleted" in p.stdout, p.stdout[-4000:]


def test_torch_dtensor_resume_at_other_world_sizes(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.tensor")
    # 3 parameters, and Adam's exp_avg, exp_avg_sq and step for each. Each job
    # costs ~25 s (torch and gloo at every rank): trained at 3 with lazy saves
    # (the fence waited on before optimizer.step()), resumed at 2; with
    # MHCKPT_LONG_TESTS=1 (scripts/test.sh's long form) at 2, 3, then 2.
    sizes = [2, 3, 2] if os.environ.get("MHCKPT_LONG_TESTS") == "1" else [3, 2]
    train_and_resume("torch_train.py", tmp_path, sizes, n_arrays=12, first_args=["--lazy"])


def _same_with_either_import(script: str, tmp_path: Path, backends, save_at: int, restore_at: int, *args: str,
                             resume=None):
    """Runs ``script`` with each backend (the import it names): trains at
    ``save_at`` processes, then resumes at ``restore_at`` (the backends of
    ``resume``, default all). The fingerprints of the last save, of the
    restore, and of the last save after the restore are the same for every
    backend, and the restore gives back the save's."""
    saves, resumes = {}, {}
    for backend in backends:
        ckpt = tmp_path / f"{backend}_ckpt"
        first, second = tmp_path / f"{backend}_save.json", tmp_path / f"{backend}_resume.json"
        run_ok(script, save_at, "--backend", backend, "--ckpt", str(ckpt), "--steps", "10",
               "--fingerprint", str(first), *args)
        saves[backend] = json.loads(first.read_text())["saved"]
        if resume is not None and backend not in resume:
            continue
        out = run_ok(script, restore_at, "--backend", backend, "--ckpt", str(ckpt), "--steps", "14",
                     "--resume", "--fingerprint", str(second), *args)
        assert f"restored step 8 on {restore_at} processes" in out, out[-4000:]
        resumed = json.loads(second.read_text())
        assert resumed["restored"] == saves[backend], f"{script} --backend {backend}: restored != saved"
        resumes[backend] = (resumed["restored"], resumed["saved"])
    reference = backends[0]
    assert len(saves[reference]) >= 6, saves[reference]
    for backend in backends[1:]:
        assert saves[backend] == saves[reference], f"{script}: {backend} saved other state than {reference}"
    for backend in list(resumes)[1:]:
        assert resumes[backend] == resumes[next(iter(resumes))], f"{script}: the resumes differ"


def test_orbax_code_with_mhckpt_orbax(tmp_path):
    """The same Orbax program with `import orbax.checkpoint as ocp` and with
    `import mhckpt.orbax as ocp`: saved at 2 processes, restored at 3."""
    pytest.importorskip("jax")
    pytest.importorskip("orbax.checkpoint")
    _same_with_either_import("orbax_train.py", tmp_path, ["orbax", "mhckpt"], 2, 3, "--style", "args")


def test_orbax_seed_pattern_with_mhckpt_orbax(tmp_path):
    """The seed's Orbax code: an AsyncCheckpointer with aggregate=True save
    args, each save followed at once by a jitted update that donates the state.
    Real Orbax too with MHCKPT_LONG_TESTS=1."""
    pytest.importorskip("jax")
    backends = ["mhckpt"]
    if os.environ.get("MHCKPT_LONG_TESTS") == "1":
        pytest.importorskip("orbax.checkpoint")
        backends.insert(0, "orbax")
    _same_with_either_import("orbax_train.py", tmp_path, backends, 2, 3, "--style", "legacy")


def test_dcp_code_with_mhckpt_torch(tmp_path):
    """The same FSDP2 program with `import torch.distributed.checkpoint as dcp`
    and with `import mhckpt.torch as dcp` (async_save): saved at 2 processes,
    loaded at 3 with mhckpt.torch, the same state as DCP saved. Each job costs
    ~10 s (torch at every rank): DCP's own load at 3 only with
    MHCKPT_LONG_TESTS=1 (test_dcp.py compares the two loads at each world size)."""
    pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.fsdp")
    resume = None if os.environ.get("MHCKPT_LONG_TESTS") == "1" else ["mhckpt"]
    _same_with_either_import("dcp_train.py", tmp_path, ["dcp", "mhckpt"], 2, 3, "--async-save", resume=resume)


def test_orbax_best_checkpoints_with_mhckpt_orbax(tmp_path):
    """Keeping the best checkpoints (orbax_best.py: best_fn with best_mode
    'max' and 'min', keep_checkpoints_without_metrics both ways, max_to_keep=2,
    keep_period), best_step() and delete(), with Orbax and with mhckpt.orbax:
    saved at 2 processes, reopened at 3, where best_step() is restored and
    three more steps saved. Everything each run saw is the same for both."""
    pytest.importorskip("jax")
    pytest.importorskip("orbax.checkpoint")
    reports = {}
    for backend in ("orbax", "mhckpt"):
        for phase, nproc in (("save", 2), ("resume", 3)):
            report = tmp_path / f"{backend}_{phase}.json"
            run_ok("orbax_best.py", nproc, "--backend", backend, "--ckpt", str(tmp_path / backend),
                   "--phase", phase, "--report", str(report))
            reports[backend, phase] = json.loads(report.read_text())
    for phase in ("save", "resume"):
        assert reports["mhckpt", phase] == reports["orbax", phase], f"orbax_best.py --phase {phase}: they differ"
    # Orbax's rules, as both applied them: the best 2 with metrics (equal
    # ones: the later step), those without metrics or not, keep_period's.
    save, resume = reports["orbax", "save"], reports["orbax", "resume"]
    assert (save["accuracy"]["steps"], save["accuracy"]["best"]) == ([2, 5, 7, 8], 8)
    assert (save["loss"]["steps"], save["loss"]["best"]) == ([0, 4, 5, 8], 8)
    assert save["accuracy"]["delete"] == {"7": ["deleted", [2, 5, 8], 8],
                                          "9": ["FileNotFoundError", "Requested deleting a non-existent step: 9."],
                                          "100": ["FileNotFoundError",
                                                  "Requested deleting a non-existent step: 100."]}
    assert (resume["accuracy"]["opened"], resume["loss"]["opened"]) == (
        {"steps": [2, 5, 8], "best": 8}, {"steps": [0, 4, 5, 8], "best": 8})
    assert (resume["accuracy"]["steps"], resume["accuracy"]["best"]) == ([2, 10, 11, 12], 10)
    assert (resume["loss"]["steps"], resume["loss"]["best"]) == ([0, 4, 8, 10, 12], 10)
    for name in ("accuracy", "loss"):
        assert save[name]["restored_final_best"] == save[name]["saved"]["8"]
        assert resume[name]["restored_best"] == save[name]["saved"]["8"]  # at 3 processes
        assert resume[name]["restored_final_best"] == resume[name]["saved"]["10"]
