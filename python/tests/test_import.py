"""``import mhckpt`` needs neither jax nor torch, and imports neither: a fresh
interpreter (a singleton MPI process, started by rank 0) saves and restores
numpy state, with jax and torch merely not imported, and with both blocked.
The checkpoint it saves (names made by the built-in pytree flattener)
restores here, where jax's flattener names the leaves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import namedtuple

import numpy as np
import pytest

from support import all_equal_bytes, all_ok, pattern

Pair = namedtuple("Pair", "first second")

CHILD = textwrap.dedent(
    """
    import json, sys
    if sys.argv[2] == "blocked":
        sys.modules["jax"] = None    # `import jax` raises ImportError
        sys.modules["torch"] = None
    import numpy as np
    import mhckpt
    from collections import namedtuple
    sys.path.insert(0, sys.argv[3])
    from support import pattern

    Pair = namedtuple("Pair", "first second")
    state = {
        "w": pattern("w", (5, 3), "float32"),
        "bf": pattern("bf", (4,), "bfloat16"),
        "shard": mhckpt.Shard(pattern("s", (6,), "int16"), (0,), (6,)),
        "seq": [pattern("seq0", (2,), "int8"), (pattern("seq1", (3,), "uint8"), "text")],
        "pair": Pair(np.float32(1.5), {"deep": None}),
        "n": 3,
    }
    with mhckpt.CheckpointManager(sys.argv[1], max_to_keep=1) as m:
        m.save(1, state, metadata={"by": "child"})
        m.wait_until_finished()
        out = m.restore(1, {**state, "shard": mhckpt.Shard(np.zeros(4, np.int16), (2,), (6,))})
        ok = (out["w"].tobytes() == state["w"].tobytes()
              and out["bf"].tobytes() == state["bf"].tobytes()
              and out["seq"][1][1] == "text" and out["n"] == 3
              and isinstance(out["pair"], Pair) and out["pair"].second == {"deep": None}
              and out["shard"].local.tobytes() == state["shard"].local[2:].tobytes())
        names = sorted(m.describe(1)["arrays"])
        verified = m.verify(1)
    loaded = sorted({k.split(".")[0] for k, v in sys.modules.items() if v is not None}
                    & {"jax", "jaxlib", "torch"})
    print(json.dumps({"ok": ok, "names": names, "loaded": loaded, "verified": verified}))
    """
)

NAMES = ["bf", "pair/first", "seq/0", "seq/1/0", "shard", "w"]


def child_env():
    """The environment without the mpirun job's variables: the child is a
    singleton MPI process, not a rank of this job."""
    keep = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
    return {
        k: v for k, v in os.environ.items()
        if k in keep or not k.startswith(("OMPI_", "PMIX_", "OPAL_", "ORTE_", "PMI_", "HYDRA_"))
    }


def run_child(path: str, mode: str):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run(
        [sys.executable, "-c", CHILD, path, mode, tests_dir],
        env=child_env(), cwd=tests_dir, capture_output=True, text=True, timeout=120,
    )
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"}
    return json.loads(lines[-1])


def child_saves(comm, path: str, mode: str):
    """Rank 0's child saves (and restores) under `path`; its report, on
    every rank."""
    result = run_child(path, mode) if comm.rank == 0 else None
    result = comm.bcast(result, root=0)
    assert "error" not in result, result.get("error")
    return result


@pytest.mark.parametrize("mode", ["not_imported", "blocked"])
def test_import_without_jax_and_torch(comm, root, mode):
    result = child_saves(comm, root, mode)
    assert result["loaded"] == [], f"imported without being used: {result['loaded']}"
    assert result["ok"] and result["names"] == NAMES, result
    assert result["verified"] > 0


def test_saved_without_jax_restores_with_jax(comm, root, jax_dist):
    # A child without jax saves with the built-in flattener, into this test's
    # own root.
    assert child_saves(comm, root, "not_imported")["loaded"] == []
    assert "jax" in sys.modules
    import mhckpt

    with mhckpt.CheckpointManager(root) as m:
        target = {
            "w": None, "bf": None, "shard": None, "n": None,
            "seq": [None, (np.zeros(3, np.uint8), None)],
            "pair": Pair(None, {"deep": 0}),
        }
        out = m.restore(1, target, strict=True)
        assert m.describe(1)["metadata"] == {"by": "child"}
    all_equal_bytes(comm, out["w"], pattern("w", (5, 3), "float32"), "w")
    all_equal_bytes(comm, out["seq"][1][0], pattern("seq1", (3,), "uint8"), "seq/1/0")
    all_equal_bytes(comm, out["shard"], pattern("s", (6,), "int16"), "shard")
    all_ok(comm, isinstance(out["pair"], Pair) and out["pair"].second == {"deep": None}
           and out["seq"][1][1] == "text" and out["n"] == 3, f"structure: {out}")
