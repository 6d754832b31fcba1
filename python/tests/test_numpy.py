"""numpy leaves, mhckpt.Shard, non-array values, metadata and describe()."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

import mhckpt
from support import ALL_DTYPES, all_equal_bytes, all_ok, block, np_dtype, pattern

SHAPES = {
    "bool": (5, 3), "int8": (7,), "float16": (2, 3, 4), "bfloat16": (33,), "float8_e5m2": (4, 4)
}


def dtype_state():
    """One replicated array of every dtype (several shapes)."""
    return {dt: pattern(f"dtypes/{dt}", SHAPES.get(dt, (6, 5)), dt) for dt in ALL_DTYPES}


def test_replicated_every_dtype(comm, mgr):
    state = dtype_state()
    mgr.save(1, {"dtypes": state})
    mgr.wait_until_finished()

    d = mgr.describe(1)
    for dt, a in state.items():
        stored = d["arrays"][f"dtypes/{dt}"]
        assert (stored["dtype"], stored["shape"], stored["replicated"]) == (dt, list(a.shape), True)
    assert d["total_bytes"] == sum(a.nbytes for a in state.values())

    # A new numpy array per leaf (target=None), and in place into numpy targets.
    fresh = mgr.restore(1)
    targets = {dt: np.zeros_like(a) for dt, a in state.items()}
    out = mgr.restore(1, {"dtypes": targets})
    for dt, a in state.items():
        all_equal_bytes(comm, fresh["dtypes"][dt], a, f"target=None, {dt}")
        all_equal_bytes(comm, targets[dt], a, f"in place, {dt}")
        assert out["dtypes"][dt] is targets[dt]


def test_scalars_and_empty_arrays(comm, mgr):
    state = {
        "zero_d": np.array(2.5, dtype=np.float64),
        "np_float32": np.float32(-1.25),
        "np_int64": np.int64(-(2**40) - 3),
        "np_bool": np.bool_(True),
        "np_bf16": np_dtype("bfloat16").type(3.5),
        "empty": np.zeros((0, 4), dtype=np.int32),
    }
    mgr.save(1, state)
    mgr.wait_until_finished()
    d = mgr.describe(1)
    assert d["arrays"]["np_int64"]["shape"] == [] and d["arrays"]["np_int64"]["dtype"] == "int64"
    assert d["arrays"]["empty"]["shape"] == [0, 4]

    out = mgr.restore(1)
    for k, v in state.items():
        all_equal_bytes(comm, out[k], np.asarray(v), k)
    # An np.generic target gives a 0-d array of its dtype.
    again = mgr.restore(1, {"np_float32": np.float32(0)})
    all_equal_bytes(comm, again["np_float32"], np.asarray(np.float32(-1.25)), "np.generic target")


def test_shards_row_and_column_blocks_uneven(comm, mgr):
    n, rank = comm.size, comm.rank
    rows = pattern("rows", (2 * n + 1, 5), "float32")   # uneven: rank 0 has one row more
    cols = pattern("cols", (3, 3 * n + 2), "int16")
    cube = pattern("cube", (n + 2, 2, 3), "float64")
    r0, rc = block(rows.shape[0], rank, n)
    c0, cc = block(cols.shape[1], rank, n)
    z0, zc = block(cube.shape[0], rank, n)
    state = {
        "rows": mhckpt.Shard(rows[r0 : r0 + rc], (r0, 0), rows.shape),
        "cols": mhckpt.Shard(cols[:, c0 : c0 + cc], (0, c0), cols.shape),  # non-contiguous block
        "cube": mhckpt.Shard(cube[z0 : z0 + zc], (z0, 0, 0), cube.shape),
    }
    mgr.save(3, state)
    mgr.wait_until_finished()
    d = mgr.describe(3)
    assert d["arrays"]["rows"]["replicated"] is (n == 1)  # one box for the whole array
    boxes = sorted((b["start"], b["count"]) for b in d["arrays"]["cols"]["boxes"])
    assert boxes == sorted(([0, block(cols.shape[1], r, n)[0]], [3, block(cols.shape[1], r, n)[1]])
                           for r in range(n))

    # Whole arrays.
    whole = mgr.restore(3)
    for name, full in (("rows", rows), ("cols", cols), ("cube", cube)):
        all_equal_bytes(comm, whole[name], full, f"{name}, whole")

    # Another sharding: rows split by columns and cols by rows, in reverse rank order.
    rr = n - 1 - rank
    a0, ac = block(rows.shape[1], rr, n)
    b0, bc = block(cols.shape[0], rr, n)
    target = {
        "rows": mhckpt.Shard(np.zeros((rows.shape[0], ac), np.float32), (0, a0), rows.shape),
        "cols": mhckpt.Shard(np.zeros((bc, cols.shape[1]), np.int16), (b0, 0), cols.shape),
        "cube": np.zeros(cube.shape, np.float64),
    }
    out = mgr.restore(3, target)
    assert out["rows"] is target["rows"]
    all_equal_bytes(comm, target["rows"].local, rows[:, a0 : a0 + ac], "rows, column box")
    all_equal_bytes(comm, target["cols"].local, cols[b0 : b0 + bc], "cols, row box")
    all_equal_bytes(comm, target["cube"], cube, "cube, numpy target")


def test_non_contiguous_targets_and_sources(comm, mgr):
    a = pattern("nc", (6, 8), "int32")
    f_order = np.asfortranarray(pattern("fo", (4, 5), "float64"))
    mgr.save(1, {"nc": a[:, ::2], "fo": f_order})  # a strided view and a Fortran array
    mgr.wait_until_finished()
    assert mgr.describe(1)["arrays"]["nc"]["shape"] == [6, 4]

    base = np.full((6, 8), -1, np.int32)
    fo_target = np.asfortranarray(np.zeros((4, 5)))
    out = mgr.restore(1, {"nc": base[:, 1::2], "fo": fo_target})
    all_equal_bytes(comm, base[:, 1::2], a[:, ::2], "strided target")
    all_ok(comm, (base[:, ::2] == -1).all(), "the strided target's gaps are untouched")
    all_equal_bytes(comm, fo_target, f_order, "Fortran-order target")
    assert out["fo"] is fo_target


Point = namedtuple("Point", "x y")

VALUES = {
    "none": None,
    "yes": True,
    "no": False,
    "int": -7,
    "big": 2**70 + 1,
    "float": 0.1,
    "inf": float("inf"),
    "text": "héllo, wörld ✓ 日本語 🚀",
    "empty": "",
    "nested": {"list": [1, "two", None, [3.5, {"deep": "x"}]], "tuple": (False, 2)},
    "point": Point(1, "y"),
}


def test_values(comm, mgr):
    state = {"v": VALUES, "w": pattern("w", (3,), "float32"), "who": comm.rank}
    mgr.save(5, state)
    mgr.wait_until_finished()

    # With the saved structure as target: the same values, lists and tuples kept.
    out = mgr.restore(5, state)
    all_ok(comm, out["v"] == VALUES, f"values: {out['v']}")
    all_ok(comm, type(out["v"]["point"]) is Point and type(out["v"]["nested"]["tuple"]) is tuple,
           "containers rebuilt from the target")
    all_ok(comm, out["who"] == 0, "values are rank 0's")
    all_equal_bytes(comm, out["w"], state["w"], "array next to values")

    # target=None: nested dicts by name, sequence items keyed by index.
    plain = mgr.restore(5)
    assert plain["v"]["nested"]["list"] == {
        "0": 1, "1": "two", "2": None, "3": {"0": 3.5, "1": {"deep": "x"}}
    }
    assert plain["v"]["text"] == VALUES["text"] and plain["v"]["big"] == 2**70 + 1
    assert plain["v"]["point"] == {"x": 1, "y": "y"}
    assert plain["who"] == 0
    d = mgr.describe(5)
    assert d["values"]["v/big"] == 2**70 + 1 and d["values"]["v/text"] == VALUES["text"]
    assert "v/none" in d["values"] and d["values"]["v/none"] is None
    assert set(d["arrays"]) == {"w"}


def test_metadata_and_describe(comm, mgr):
    meta = {"epoch": 3, "lr": 1e-3, "note": "Ünïcode ✓", "cfg": {"layers": [1, 2], "ok": True}}
    # Metadata is rank 0's, like values.
    mgr.save(7, {"a": pattern("a", (4, 4), "float32")}, metadata={**meta, "rank": comm.rank})
    mgr.wait_until_finished()
    d = mgr.describe(7)
    assert d["metadata"] == {**meta, "rank": 0}
    assert d["step"] == 7 and d["world_size"] == comm.size
    assert d["total_bytes"] == 64 and d["values"] == {}
    a = d["arrays"]["a"]
    assert (a["dtype"], a["shape"], a["replicated"]) == ("float32", [4, 4], True)
    assert [(b["start"], b["count"]) for b in a["boxes"]] == [([0, 0], [4, 4])]


def test_restore_subset_and_strict(comm, mgr):
    mgr.save(1, {"a": pattern("a", (3,), "int8"), "b": pattern("b", (2,), "int8"), "v": 1})
    mgr.wait_until_finished()
    out = mgr.restore(1, {"b": None})
    all_equal_bytes(comm, out["b"], pattern("b", (2,), "int8"), "a subset")
    with pytest.raises(mhckpt.InvalidArgumentError, match=r"strict restore of step 1.*\['a'\]"):
        mgr.restore(1, {"b": None}, strict=True)
    full = mgr.restore(1, {"a": None, "b": None, "v": None}, strict=True)
    assert full["v"] == 1


@pytest.mark.parametrize("read_once", [True, False])
def test_restore_shared_boxes_read_once_or_not(comm, mgr, read_once):
    # Two "tensor-parallel" halves of a sharded array, each wanted by every
    # other rank (data-parallel copies): with read_once one rank reads each
    # half and sends it; without, every rank reads its own. Same bytes.
    n, rank = comm.size, comm.rank
    w = pattern("tp_dp", (4 * n + 2, 6), "float32")
    r0, rc = block(w.shape[0], rank, n)
    mgr.save(4, {"w": mhckpt.Shard(w[r0 : r0 + rc], (r0, 0), w.shape)})
    mgr.wait_until_finished()
    half = w.shape[0] // 2
    lo = 0 if rank % 2 == 0 else half
    hi = half if rank % 2 == 0 else w.shape[0]
    target = {"w": mhckpt.Shard(np.zeros((hi - lo, 6), np.float32), (lo, 0), w.shape)}
    mgr.restore(4, target, read_once=read_once)
    all_equal_bytes(comm, target["w"].local, w[lo:hi], f"half {rank % 2}, read_once={read_once}")


@pytest.mark.parametrize("prefault", [True, False])
def test_restore_into_new_arrays_with_or_without_prefault(comm, mgr, prefault):
    # 12 MiB in new numpy arrays (target None): read in several requests,
    # with the read-ahead thread faulting their pages in (True) or without
    # (False). Same bytes either way.
    n, rank = comm.size, comm.rank
    w = pattern("prefault", (3072, 1024), "float32")
    r0, rc = block(w.shape[0], rank, n)
    mgr.save(5, {"w": mhckpt.Shard(w[r0 : r0 + rc], (r0, 0), w.shape)})
    mgr.wait_until_finished()
    out = mgr.restore(5, None, prefault=prefault)
    all_equal_bytes(comm, out["w"], w, f"prefault={prefault}")


@pytest.mark.parametrize("direct_reads", [True, False])
def test_new_arrays_are_page_aligned_and_exact_with_or_without_direct_reads(
    comm, mgr, direct_reads
):
    # The arrays a restore makes start on a page boundary (so that their
    # rows line up with the file and are read with O_DIRECT), for every
    # dtype, empty ones and odd shapes too; the same bytes with direct
    # reads on or off.
    n, rank = comm.size, comm.rank
    w = pattern("direct", (2048, 1536), "float32")  # 12 MiB, rows of 6 KiB
    r0, rc = block(w.shape[0], rank, n)
    odd = pattern("odd", (37, 5), "int16")
    mgr.save(6, {"w": mhckpt.Shard(w[r0 : r0 + rc], (r0, 0), w.shape), "odd": odd,
                 "none": np.zeros((0, 3), np.float64)})
    mgr.wait_until_finished()
    out = mgr.restore(6, None, direct_reads=direct_reads)
    for name in ("w", "odd"):
        assert out[name].ctypes.data % 4096 == 0, name
        assert out[name].flags.c_contiguous and out[name].flags.writeable, name
    assert out["none"].shape == (0, 3) and out["none"].dtype == np.float64
    all_equal_bytes(comm, out["w"], w, f"direct_reads={direct_reads}")
    all_equal_bytes(comm, out["odd"], odd, f"direct_reads={direct_reads}")
    for dt in ALL_DTYPES:
        a = mhckpt.empty((3, 5), np_dtype(dt))
        assert a.ctypes.data % 4096 == 0 and a.shape == (3, 5) and a.dtype == np_dtype(dt), dt
    # In place into mhckpt.empty arrays: the same bytes.
    t = mhckpt.Shard(mhckpt.empty((rc, w.shape[1]), np.float32), (r0, 0), w.shape)
    mgr.restore(6, {"w": t}, direct_reads=direct_reads)
    all_equal_bytes(comm, t.local, w[r0 : r0 + rc], f"in place, direct_reads={direct_reads}")
