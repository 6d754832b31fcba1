"""jax.Array leaves (one CPU device per rank, jax.distributed over gloo) and
jax restore targets."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, all_ok, pattern


def check_jax(comm, jd, out, want: np.ndarray, sharding, what: str) -> None:
    """``out`` is a jax.Array with ``sharding`` whose every addressable shard
    holds ``want``'s bytes at its index."""
    jax = jd.jax
    all_ok(comm, isinstance(out, jax.Array), f"{what}: a jax.Array, not {type(out)}")
    all_ok(comm, out.shape == want.shape and np.dtype(out.dtype) == want.dtype,
           f"{what}: shape/dtype")
    all_ok(comm, out.sharding.is_equivalent_to(sharding, want.ndim),
           f"{what}: sharding {out.sharding}")
    for s in out.addressable_shards:
        all_equal_bytes(comm, np.asarray(s.data), want[s.index], f"{what}: shard {s.index}")


def saved_state(jd):
    n = jd.size
    x = jd.sharding(("x", None))
    y = jd.sharding((None, "x"))
    rep = jd.sharding(())
    data = {
        "rows": pattern("jax/rows", (4 * n, 12), "float32"),
        "cols": pattern("jax/cols", (5, 2 * n), "int32"),
        "rep": pattern("jax/rep", (12, 7), "uint8"),
        "bf16": pattern("jax/bf16", (2 * n, 3), "bfloat16"),
        "scalar": pattern("jax/scalar", (), "int32"),
    }
    shardings = {"rows": x, "cols": y, "rep": rep, "bf16": x, "scalar": rep}
    state = {k: jd.array(v, shardings[k]) for k, v in data.items()}
    return data, shardings, state


def test_jax_leaves_and_targets(comm, jd_mgr):
    jd, mgr = jd_mgr
    jax = jd.jax
    data, shardings, state = saved_state(jd)
    mgr.save(1, {"jax": state, "step": 1})
    mgr.wait_until_finished()

    d = mgr.describe(1)
    n = comm.size
    assert d["arrays"]["jax/rows"]["dtype"] == "float32"
    assert d["arrays"]["jax/bf16"]["dtype"] == "bfloat16"
    assert d["arrays"]["jax/rep"]["replicated"] is True
    assert len(d["arrays"]["jax/rows"]["boxes"]) == n  # one box per device, one writer each
    assert sorted(b["writer"] for b in d["arrays"]["jax/rows"]["boxes"]) == list(range(n))

    # jax.Array targets with the save's sharding.
    out = mgr.restore(1, {"jax": state, "step": 0})
    assert out["step"] == 1
    for k, v in data.items():
        check_jax(comm, jd, out["jax"][k], v, shardings[k], f"{k}, same sharding")

    # ShapeDtypeStruct targets with other shardings (12 divides by 1..4 ranks):
    # rows by columns, the replicated array by rows, sharded arrays replicated.
    other = {
        "rows": jd.sharding((None, "x")),
        "cols": jd.sharding(()),
        "rep": jd.sharding(("x", None)),
        "bf16": jd.sharding(()),
        "scalar": jd.sharding(()),
    }
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=other[k]) for k, v in data.items()}
    out = mgr.restore(1, {"jax": target})
    for k, v in data.items():
        check_jax(comm, jd, out["jax"][k], v, other[k], f"{k}, ShapeDtypeStruct target")

    # Into numpy, whole and as Shards.
    whole = mgr.restore(1)
    for k, v in data.items():
        all_equal_bytes(comm, whole["jax"][k], v, f"{k}, numpy")


def test_jax_two_dimensional_mesh(comm, jd_mgr):
    jd, mgr = jd_mgr
    n = comm.size
    if n % 2:
        pytest.skip("a 2 x N/2 mesh needs an even world size")
    mesh = jd.mesh((2, n // 2), ("a", "b"))
    s2 = jd.sharding(("a", "b"), mesh)
    data = pattern("jax/grid", (4, n), "float16")
    mgr.save(2, {"grid": jd.array(data, s2)})
    mgr.wait_until_finished()
    assert len(mgr.describe(2)["arrays"]["grid"]["boxes"]) == n
    t = jd.jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=jd.sharding(("x", None)))
    check_jax(comm, jd, mgr.restore(2, {"grid": t})["grid"], data, t.sharding, "grid, 1-d target")


def test_numpy_saved_restores_into_jax(comm, jd_mgr):
    jd, mgr = jd_mgr
    n = comm.size
    data = pattern("np_to_jax", (2 * n, 3), "float8_e4m3fn")
    mgr.save(3, {"w": data})
    mgr.wait_until_finished()
    sharding = jd.sharding(("x", None))
    target = jd.jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    check_jax(comm, jd, mgr.restore(3, {"w": target})["w"], data, sharding, "numpy -> jax")
    # A ShapeDtypeStruct without a sharding: this process's first device.
    plain = mgr.restore(3, {"w": jd.jax.ShapeDtypeStruct(data.shape, data.dtype)})["w"]
    all_equal_bytes(comm, np.asarray(plain), data, "ShapeDtypeStruct without sharding")


def test_jax_target_mismatch_names_the_key(comm, jd_mgr):
    from support import raises_everywhere

    jd, mgr = jd_mgr
    mgr.save(4, {"w": jd.array(pattern("w", (comm.size, 2), "float32"), jd.sharding(("x", None)))})
    mgr.wait_until_finished()
    bad = jd.jax.ShapeDtypeStruct((comm.size, 2), np.float16, sharding=jd.sharding(()))
    raises_everywhere(comm, mhckpt.InvalidArgumentError, lambda: mgr.restore(4, {"w": bad}),
                      contains=["'w'", "float16", "float32"])


@dataclasses.dataclass
class TrainState:
    """Registered below with jax.tree_util.register_dataclass, as
    flax.struct.dataclass registers a TrainState; `name` is static."""
    step: Any
    params: Any
    opt: Any
    name: str = "mlp"


class Pair:
    """A node with its own flatten and no key paths (register_pytree_node_class)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def tree_flatten(self):
        return (self.a, self.b), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


class Moments:
    """A node with key paths (register_pytree_with_keys), as nnx.State and
    equinox modules have."""

    def __init__(self, mu, nu):
        self.mu, self.nu = mu, nu


def _register(jax) -> None:
    if getattr(_register, "done", False):
        return
    jax.tree_util.register_dataclass(TrainState, data_fields=["step", "params", "opt"],
                                     meta_fields=["name"])
    jax.tree_util.register_pytree_node_class(Pair)
    jax.tree_util.register_pytree_with_keys(
        Moments,
        lambda m: (((jax.tree_util.GetAttrKey("mu"), m.mu), (jax.tree_util.GetAttrKey("nu"), m.nu)),
                   None),
        lambda aux, children: Moments(*children))
    _register.done = True


def test_registered_pytrees_restore_with_their_own_types(comm, jd_mgr):
    jd, mgr = jd_mgr
    jax = jd.jax
    _register(jax)
    n = comm.size
    rows = jd.sharding(("x", None))
    data = {"w": pattern("reg/w", (2 * n, 3), "float32"), "b": pattern("reg/b", (5,), "float64"),
            "mu": pattern("reg/mu", (2 * n, 3), "bfloat16"), "nu": pattern("reg/nu", (4,), "int32")}
    state = TrainState(step=np.int64(7), params=Pair(jd.array(data["w"], rows), data["b"]),
                       opt=Moments(jd.array(data["mu"], rows), data["nu"]), name="big")
    mgr.save(5, state)
    mgr.wait_until_finished()
    # Leaves named by their key paths: fields and attributes by name, a node
    # without keys by index.
    all_ok(comm, sorted(mgr.describe(5)["arrays"]) ==
           ["opt/mu", "opt/nu", "params/0", "params/1", "step"], "names by key path")

    sds = jax.ShapeDtypeStruct
    target = TrainState(step=np.int64(0), params=Pair(sds((2 * n, 3), np.float32, sharding=rows),
                                                      np.zeros(5)),
                        opt=Moments(sds((2 * n, 3), data["mu"].dtype, sharding=rows),
                                    np.zeros(4, np.int32)), name="big")
    out = mgr.restore(5, target)
    all_ok(comm, type(out) is TrainState and out.name == "big" and type(out.params) is Pair and
           type(out.opt) is Moments, f"types: {type(out)}, {type(out.params)}, {type(out.opt)}")
    all_ok(comm, int(out.step) == 7, "step")
    check_jax(comm, jd, out.params.a, data["w"], rows, "params.a")
    all_equal_bytes(comm, np.asarray(out.params.b), data["b"], "params.b")
    check_jax(comm, jd, out.opt.mu, data["mu"], rows, "opt.mu")
    all_equal_bytes(comm, np.asarray(out.opt.nu), data["nu"], "opt.nu")
    # Without a target: nested dicts, keyed as the names are.
    whole = mgr.restore(5)
    all_equal_bytes(comm, whole["params"]["0"], data["w"], "no target: params/0")
    all_equal_bytes(comm, whole["opt"]["mu"], data["mu"], "no target: opt/mu")


@pytest.fixture
def jd_mgr(jax_dist, mgr):
    return jax_dist, mgr
