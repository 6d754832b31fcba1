"""The pytree mapping, property-tested: random nested trees either come back
from save + restore exactly -- the same containers, keys, leaf types, values,
dtypes, shapes and bytes -- or are refused by ``save`` itself with an
``mhckpt.InvalidArgumentError``, the same on every rank. Never silently
altered, never refused late (by ``wait_until_finished``).

Trees are drawn from a seeded generator (the same on every rank): dicts with
keys that include '/', '.', '..', unicode, a lone surrogate, control
characters and the empty string; lists, tuples, None, Python ints (beyond 64
bits too), floats (NaN, infinities, -0.0, subnormals), bools and strings,
and an IntEnum (a subclass of int); numpy scalars; numpy arrays of every
dtype mhckpt stores and of some it does not, 0-d, zero-size and
non-contiguous. An independent model of the naming rules says
which trees must be refused; each tree runs with the built-in flattener and
(when jax is installed) with jax.tree_util's.
"""
from __future__ import annotations

import enum
import math
import random
import struct
from typing import Any, List, Optional, Tuple

import numpy as np
import pytest

import mhckpt
from mhckpt import _pytree
from support import ALL_DTYPES, all_ok, np_dtype

TREES = 200
SEED = 20261203

KEYS = ["a", "b", "w", "layer0", "bias", "0", "1", "value", "x/y", "a/b", "a.b", ".", "..",
        "", " ", "é", "日本", "tab\t", "nul\x00", "/lead", "trail/", "\ud800", "-", "a b"]
INTS = [0, 1, -1, 7, 2**31, -2**63, 2**63, 2**64 + 5, -10**30]
FLOATS = [0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, float("nan"), float("inf"), float("-inf")]
STRS = ["", "x", "é", "日本語", "\x00", "quote\"back\\slash", "line\nbreak", "\ud800", "a/b"]
UNSUPPORTED = ["complex64", ">i4", ">f8", "U3", "datetime64[s]", "object"]


class Color(enum.IntEnum):  # a subclass of int: JSON would give back an int
    RED = 1


def _array(rng: random.Random, nrng: np.random.Generator) -> np.ndarray:
    if rng.random() < 0.08:
        dt = np.dtype(rng.choice(UNSUPPORTED))
        shape = (rng.randint(0, 3),)
        if dt.kind == "O":
            return np.array([None] * shape[0], dtype=object)
        if dt.kind in "iuf":  # big-endian: values whose bytes differ from native
            return (np.arange(shape[0]) + 1).astype(dt)
        return np.zeros(shape, dt)
    dt = np_dtype(rng.choice(ALL_DTYPES))
    ndim = rng.choice([0, 0, 1, 1, 2, 2, 3])
    shape = tuple(rng.choice([0, 1, 2, 3, 5]) if rng.random() < 0.15 else rng.randint(1, 6)
                  for _ in range(ndim))
    n = int(np.prod(shape, dtype=np.int64))
    if dt == np.bool_:
        a = nrng.integers(0, 2, size=n).astype(bool)
    else:  # any bit pattern: NaN payloads, negative zeros, subnormals
        a = nrng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8).view(dt)
    a = a.reshape(shape)
    if ndim == 2 and rng.random() < 0.3:
        a = a.T  # not contiguous
    return a


def _value(rng: random.Random) -> Any:
    kind = rng.randrange(5)
    if rng.random() < 0.03:
        return Color.RED
    if rng.random() < 0.1:  # a numpy scalar: an array, not a value
        dt = np_dtype(rng.choice(ALL_DTYPES))
        return np.frombuffer(bytes(rng.randrange(256) for _ in range(dt.itemsize)), dt)[0] \
            if dt != np.bool_ else np.bool_(rng.random() < 0.5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(INTS)
    if kind == 3:
        return rng.choice(FLOATS)
    return rng.choice(STRS)


def _tree(rng: random.Random, nrng: np.random.Generator, depth: int) -> Any:
    r = rng.random()
    if depth == 0 or r < 0.35:
        return _array(rng, nrng) if rng.random() < 0.5 else _value(rng)
    n = rng.randint(0, 4)
    if r < 0.75:
        d = {rng.choice(KEYS): _tree(rng, nrng, depth - 1) for _ in range(n)}
        if rng.random() < 0.1:  # names that meet: "x/y" beside {"x": {"y": ...}}
            x, y = rng.choice(["a", "w", "0"]), rng.choice(["b", "1"])
            d[f"{x}/{y}"] = _array(rng, nrng) if rng.random() < 0.7 else _value(rng)
            d[x] = {y: _value(rng)} if rng.random() < 0.5 else _array(rng, nrng)
        return d
    kids = [_tree(rng, nrng, depth - 1) for _ in range(n)]
    return kids if rng.random() < 0.5 else tuple(kids)


# ------------------------------------------------------------- the model


def _leaves_of(tree: Any, path: Tuple[str, ...] = ()) -> List[Tuple[str, Any]]:
    """(name, leaf) in the order and with the names the mapping documents:
    dict keys sorted, sequence items by index, joined with '/'."""
    if isinstance(tree, dict):
        out = []
        for k in sorted(tree):
            out += _leaves_of(tree[k], path + (k,))
        return out
    if isinstance(tree, (list, tuple)):
        out = []
        for i, v in enumerate(tree):
            out += _leaves_of(v, path + (str(i),))
        return out
    return [("/".join(path) if path else "value", tree)]


def _name_ok(name: str) -> bool:
    if not name or len(name) > 1024 or name.startswith("/"):
        return False
    if not all(0x20 <= ord(c) <= 0x7E for c in name):
        return False
    parts = name.split("/")
    return len(parts) <= 64 and all(p not in ("", ".", "..") for p in parts)


def _why_refused(tree: Any) -> Optional[str]:
    """Why ``save`` must refuse ``tree``, or None if it must round-trip."""
    leaves = _leaves_of(tree)
    names = [n for n, _ in leaves]
    if len(set(names)) != len(names):
        return "two leaves with one name"
    arrays = [n for n, v in leaves if isinstance(v, (np.ndarray, np.generic))]
    for n, v in leaves:
        if type(v) not in (type(None), bool, int, float, str, np.ndarray) and \
                not isinstance(v, np.generic):
            return f"a {type(v).__name__} leaf"
        if isinstance(v, (np.ndarray, np.generic)):
            if not _name_ok(n):
                return f"bad array name {n!r}"
            if not v.dtype.isnative or v.dtype.name not in set(ALL_DTYPES):
                return f"dtype {v.dtype.str}"
    groups = {"/".join(n.split("/")[:i]) for n in arrays for i in range(1, n.count("/") + 1)}
    if groups & set(arrays):
        return "an array named like a group"
    return None


# ------------------------------------------------------------ comparison


def _same_float(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))


def _diff(got: Any, want: Any, target: Any, where: str) -> Optional[str]:
    """None if ``got`` is ``want`` exactly (a numpy scalar restored into a
    None target: as a 0-d array), else where they differ."""
    if isinstance(want, np.generic) and target is None:
        want = np.asarray(want)
    if type(got) is not type(want):
        return f"{where}: {type(got).__name__} instead of {type(want).__name__}"
    if isinstance(want, dict):
        if set(got) != set(want):
            return f"{where}: keys {sorted(got)!r} instead of {sorted(want)!r}"
        for k in want:
            d = _diff(got[k], want[k], target[k], f"{where}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{where}: {len(got)} items instead of {len(want)}"
        for i, (g, w, t) in enumerate(zip(got, want, target)):
            d = _diff(g, w, t, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(want, (np.ndarray, np.generic)):
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"{where}: {got.dtype}{got.shape} instead of {want.dtype}{want.shape}"
        if np.ascontiguousarray(got).tobytes() != np.ascontiguousarray(want).tobytes():
            return f"{where}: other bytes"
        return None
    if isinstance(want, float):
        return None if _same_float(got, want) else f"{where}: {got!r} instead of {want!r}"
    return None if got == want else f"{where}: {got!r} instead of {want!r}"


def _target(tree: Any, rng: random.Random) -> Any:
    """The tree's structure with fresh leaves: None, or for an array at
    random a new array of its shape and dtype (filled in place)."""
    if isinstance(tree, dict):
        return {k: _target(v, rng) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_target(v, rng) for v in tree)
    if isinstance(tree, np.ndarray) and rng.random() < 0.5:
        return np.full(tree.shape, 0xA5, np.uint8).view(tree.dtype) if tree.dtype.itemsize == 1 \
            else np.zeros(tree.shape, tree.dtype)
    if isinstance(tree, np.generic) and rng.random() < 0.5:
        return np.zeros((), tree.dtype)[()]  # a numpy scalar: restored as one
    return None


@pytest.fixture(params=["builtin", "jax"])
def flattener(request, monkeypatch):
    if request.param == "jax":
        pytest.importorskip("jax")
        monkeypatch.setattr(_pytree, "_using_jax", lambda: True)
    else:
        monkeypatch.setattr(_pytree, "_using_jax", lambda: False)
    return request.param


def test_random_trees_round_trip_or_are_refused_at_save(comm, root, flattener):
    rng = random.Random(SEED + (flattener == "jax"))
    nrng = np.random.default_rng(SEED)
    counts = {"round-trip": 0, "refused": 0}
    with mhckpt.CheckpointManager(root, max_to_keep=1, collective_timeout_seconds=120) as mgr:
        step = 0
        for i in range(TREES // 2):
            tree = _tree(rng, nrng, depth=3)
            why = _why_refused(tree)
            try:
                mgr.save(step, tree)
                refused: Optional[BaseException] = None
            except mhckpt.Error as e:
                refused = e
            if why is not None:
                assert isinstance(refused, mhckpt.InvalidArgumentError), \
                    f"tree {i} ({why}) was not refused at save: {refused!r}\n{tree!r}"
                counts["refused"] += 1
                continue
            assert refused is None, f"tree {i} was refused: {refused}\n{tree!r}"
            mgr.wait_until_finished()
            target = _target(tree, rng)
            if target is None:  # a lone leaf: None would ask for everything, by name
                target = np.zeros(tree.shape, tree.dtype) if isinstance(tree, np.ndarray) else \
                    np.zeros((), tree.dtype)[()] if isinstance(tree, np.generic) else 0
            got = mgr.restore(step, target)
            d = _diff(got, tree, target, "tree")
            all_ok(comm, d is None, f"tree {i}: {d}\n{tree!r}")
            counts["round-trip"] += 1
            step += 1
    # The generator reaches both outcomes often.
    assert counts["round-trip"] >= 30 and counts["refused"] >= 10, counts
