"""torch.Tensor, nn.Parameter and DTensor leaves (gloo process group, CPU
DeviceMesh) and torch restore targets."""
from __future__ import annotations

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, all_ok, dtensor_slice, pattern, torch_local, torch_tensor


@pytest.fixture
def td_mgr(torch_dist, mgr):
    return torch_dist, mgr


def test_replicated_tensors_and_parameter(comm, td_mgr):
    td, mgr = td_mgr
    torch = td.torch
    w = pattern("t/w", (5, 3), "float32")
    ids = pattern("t/ids", (7,), "int64")
    mask = pattern("t/mask", (2, 2), "bool")
    half = pattern("t/half", (4,), "float16")
    bf = pattern("t/bf", (6,), "bfloat16")
    state = {
        "w": torch.nn.Parameter(torch.from_numpy(w.copy())),  # requires_grad=True
        "ids": torch.from_numpy(ids.copy()),
        "mask": torch.from_numpy(mask.copy()),
        "half": torch.from_numpy(half.copy()),
        "bf": torch_tensor(bf),
    }
    assert state["w"].requires_grad
    mgr.save(1, state)
    mgr.wait_until_finished()
    d = mgr.describe(1)
    assert {k: d["arrays"][k]["dtype"] for k in state} == {
        "w": "float32", "ids": "int64", "mask": "bool", "half": "float16", "bf": "bfloat16"
    }

    # Filled in place: the same objects come back, a Parameter stays one.
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    target["w"] = torch.nn.Parameter(torch.zeros(5, 3))
    out = mgr.restore(1, target)
    for k in state:
        assert out[k] is target[k]
    assert isinstance(out["w"], torch.nn.Parameter) and out["w"].requires_grad
    for k, want in (("w", w), ("ids", ids), ("mask", mask), ("half", half), ("bf", bf)):
        all_equal_bytes(comm, torch_local(out[k]), want, f"{k}, torch target")

    # A non-contiguous tensor target (a transposed view) is filled through a copy.
    base = torch.zeros(3, 5)
    mgr.restore(1, {"w": base.T})
    all_equal_bytes(comm, base.numpy(), w.T, "transposed target")

    # Torch-saved arrays restore into numpy.
    plain = mgr.restore(1)
    all_equal_bytes(comm, plain["bf"], bf, "bf16 into numpy")


def test_dtensor_placements_uneven(comm, td_mgr):
    td, mgr = td_mgr
    torch = td.torch
    from torch.distributed.tensor import Replicate, Shard

    n = td.size
    rows = pattern("dt/rows", (2 * n + 1, 4), "float32")    # uneven rows
    cols = pattern("dt/cols", (3, 3 * n - 1), "int32")      # uneven columns
    rep = pattern("dt/rep", (4, 2), "float16")
    state = {
        "rows": td.dtensor(rows, Shard(0)),
        "cols": td.dtensor(cols, Shard(1)),
        "rep": td.dtensor(rep, Replicate()),
    }
    # The DTensors are built from local slices (conftest): torch agrees on them.
    for k, v in (("rows", rows), ("cols", cols)):
        all_equal_bytes(comm, state[k].full_tensor().numpy(), v, f"{k}: torch's own view")
    mgr.save(2, {"dt": state})
    mgr.wait_until_finished()
    d = mgr.describe(2)
    assert d["arrays"]["dt/rows"]["shape"] == [2 * n + 1, 4]
    assert d["arrays"]["dt/rep"]["replicated"] is True

    # Whole arrays.
    whole = mgr.restore(2)
    for k, v in (("rows", rows), ("cols", cols), ("rep", rep)):
        all_equal_bytes(comm, whole["dt"][k], v, f"{k}, numpy")

    # DTensor targets with other placements than at save, filled in place.
    swap = {"rows": Shard(1), "cols": Shard(0), "rep": Shard(0)}
    arrays = {"rows": rows, "cols": cols, "rep": rep}
    target = {k: td.dtensor(np.zeros_like(v), swap[k]) for k, v in arrays.items()}
    locals_before = {k: v.to_local() for k, v in target.items()}
    out = mgr.restore(2, {"dt": target})
    for k, v in (("rows", rows), ("cols", cols), ("rep", rep)):
        assert out["dt"][k] is target[k]
        all_equal_bytes(comm, torch_local(target[k]), dtensor_slice(td, v, swap[k]),
                        f"{k} as {swap[k]}")
        all_ok(comm, target[k].to_local().data_ptr() == locals_before[k].data_ptr(),
               f"{k} in place")

    # The same placements as at save, and plain tensors (the whole array).
    same = {k: td.dtensor(np.zeros_like(v), p) for k, v, p in
            (("rows", rows, Shard(0)), ("cols", cols, Shard(1)), ("rep", rep, Replicate()))}
    mgr.restore(2, {"dt": same})
    full = {"rows": torch.zeros(rows.shape), "cols": torch.zeros(cols.shape, dtype=torch.int32)}
    mgr.restore(2, {"dt": full})
    for k, v, p in (("rows", rows, Shard(0)), ("cols", cols, Shard(1)), ("rep", rep, Replicate())):
        all_equal_bytes(comm, torch_local(same[k]), dtensor_slice(td, v, p), f"{k} as {p}")
    all_equal_bytes(comm, full["rows"].numpy(), rows, "rows into a tensor")
    all_equal_bytes(comm, full["cols"].numpy(), cols, "cols into a tensor")


def test_dtensor_partial_placement_is_refused(comm, td_mgr):
    from support import raises_everywhere
    from torch.distributed.tensor import DTensor, Partial

    td, mgr = td_mgr
    partial = DTensor.from_local(td.torch.ones(2, 2), td.mesh, [Partial()])
    raises_everywhere(comm, mhckpt.InvalidArgumentError, lambda: mgr.save(1, {"p": partial}),
                      contains=["'p'", "P(sum)", "redistribute"])


def test_torch_target_mismatch_names_the_key(comm, td_mgr):
    from support import raises_everywhere

    td, mgr = td_mgr
    torch = td.torch
    mgr.save(3, {"layer": {"w": torch.ones(4, 4)}})
    mgr.wait_until_finished()
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.restore(3, {"layer": {"w": torch.zeros(4, 5)}}),
                      contains=["'layer/w'", "(4, 5)", "(4, 4)"])
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.restore(3, {"layer": {"w": torch.zeros(4, 4).double()}}),
                      contains=["'layer/w'", "float64", "float32"])
