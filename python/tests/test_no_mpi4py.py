"""Without mpi4py installed: ``python -m mhckpt convert`` and ``mhckpt.torch``
fail with an error that says how to install it (``pip install "mhckpt[mpi]"``),
on every rank, instead of a bare "No module named 'mpi4py'".

Each case is an mpirun job of 2 processes whose interpreter cannot import
mpi4py (a meta-path finder refuses it before anything imports it), so it runs
at world size 1 only (a nested mpirun inside a job of several ranks would
start a job per rank).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_examples import MPIRUN, _mpirun_env, _unpin

pytestmark = pytest.mark.skipif(int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1,
                                reason="starts its own mpirun job: runs at world size 1 only")

HINT = 'pip install "mhckpt[mpi]"'

# Refuses mpi4py as if it were not installed.
_HIDE = """
import importlib.abc, sys
class _NoMpi4py(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py" or name.startswith("mpi4py."):
            raise ModuleNotFoundError("No module named 'mpi4py'", name="mpi4py")
        return None
sys.meta_path.insert(0, _NoMpi4py())
"""


# Each rank writes its own file: the output of two ranks through mpirun's one
# pipe can come out interleaved within a line.
_PER_RANK = """
import os as _os
_fd = _os.open(_os.path.join({out!r}, "rank" + _os.environ["OMPI_COMM_WORLD_RANK"] + ".txt"),
               _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o644)
_os.dup2(_fd, 1)
_os.dup2(_fd, 2)
"""


def _job(nproc: int, code: str, out) -> tuple[int, list[str]]:
    """Runs ``code`` in ``nproc`` ranks; returns the exit code and each rank's output."""
    if MPIRUN is None:
        pytest.skip("mpirun not found")
    out.mkdir(exist_ok=True)
    cmd = [MPIRUN, "-np", str(nproc), "--oversubscribe", "--bind-to", "none",
           "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_vader_single_copy_mechanism", "none",
           sys.executable, "-c", _PER_RANK.format(out=str(out)) + _HIDE + code]
    p = subprocess.run(cmd, env=_mpirun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=180, preexec_fn=_unpin, cwd="/")
    outputs = []
    for r in range(nproc):
        f = out / f"rank{r}.txt"
        outputs.append(f.read_text() if f.exists() else f"(rank {r} wrote nothing)\n{p.stdout[-4000:]}")
    return p.returncode, outputs


def test_hidden_mpi4py_is_not_importable(tmp_path):
    _, (out,) = _job(1, "try:\n    import mpi4py\nexcept ImportError as e:\n"
                        "    print('REFUSED', e)\n", tmp_path / "out")
    assert "REFUSED No module named 'mpi4py'" in out, out[-4000:]


def _only_line(out: str, prefixes) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(prefixes)]
    assert len(lines) == 1, out[-4000:]
    return lines[0]


def test_convert_without_mpi4py_says_how_to_install(tmp_path):
    # `python -m mhckpt convert` (its __main__ run as the command line runs it).
    rc, outs = _job(2, "import runpy\n"
                       f"sys.argv = ['mhckpt', 'convert', {str(tmp_path / 'src')!r}, {str(tmp_path / 'dst')!r}]\n"
                       "runpy.run_module('mhckpt', run_name='__main__', alter_sys=True)\n",
                    tmp_path / "out")
    assert rc != 0, outs
    lines = [_only_line(out, "python -m mhckpt convert:") for out in outs]
    assert all(HINT in ln for ln in lines), lines
    assert len(set(lines)) == 1, lines  # the same error on every rank
    assert not any("Traceback" in out for out in outs), outs


@pytest.mark.parametrize("call", ["save", "load"])
def test_torch_no_dist_without_mpi4py_says_how_to_install(tmp_path, call):
    pytest.importorskip("torch")
    _, outs = _job(2, "import os, mhckpt.torch as dcp, torch\n"
                      "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
                      f"root = os.path.join({str(tmp_path)!r}, 'r' + rank)\n"
                      "os.makedirs(root, exist_ok=True)  # load looks for the directory first\n"
                      "try:\n"
                      f"    dcp.{call}({{'w': torch.zeros(4)}}, checkpoint_id=root, no_dist=True)\n"
                      "except ImportError as e:\n"
                      "    print('ERROR', type(e).__name__, e, flush=True)\n"
                      "else:\n"
                      "    print('NO ERROR', flush=True)\n",
                   tmp_path / "out")
    lines = [_only_line(out, ("ERROR", "NO ERROR")) for out in outs]
    assert all(ln.startswith("ERROR ImportError") and HINT in ln for ln in lines), lines
    assert len(set(lines)) == 1, lines
