"""jax.Array on CUDA devices: a save takes each shard through DLPack with a
consumer stream (``__dlpack__(stream=1)``, the legacy default stream, which
is also the stream mhckpt orders its copy with), so the host does not wait
for the computation that defines it; a restore into a target on a CUDA device
fills device arrays in place (mhckpt/_jax.py). Arrays are donated and their
memory written over right after ``save`` (after ``fence.wait()`` with
``lazy=True``), and the bytes restored must be the saved ones, also at
another process count (saved at N >= 2 ranks, restored at 1).

Run on its own (the GPU bundle's jax.* steps): jax picks its platform once per
process, and the rest of the suite runs jax on CPU (conftest's ``jax_dist``).
Several ranks may share one GPU. Skipped without a CUDA device for jax.
"""
from __future__ import annotations

import importlib.util
import os
import pkgutil

# Several processes may share one GPU: no process may take most of its memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mhckpt  # noqa: E402
from support import all_ok, free_port, np_dtype, pattern  # noqa: E402

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding  # noqa: E402

import mhckpt._jax as mjax  # noqa: E402

# name -> (global shape, dtype, PartitionSpec over the 1-d mesh "x" of every
# process's device). Rows divide by 1 to 4 processes (jax shards evenly).
ARRAYS = {
    "bf16": ((24, 48), "bfloat16", ("x", None)),
    "f8": ((12, 48), "float8_e4m3fn", (None, "x")),
    "f32": ((12, 6), "float32", ("x",)),
    "rep": ((5, 3), "bfloat16", ()),
}


def _jax_has_cuda() -> bool:
    """A CUDA plugin of jax is installed (jax[cuda12] / jax[cuda13]), found
    without initialising a backend."""
    if importlib.util.find_spec("jax_plugins") is None:
        return False
    import jax_plugins

    return any("cuda" in m.name for m in pkgutil.iter_modules(jax_plugins.__path__))


@pytest.fixture(scope="module")
def gpu(request, comm):
    """jax.distributed over every rank, each with its CUDA device (devices
    may repeat: ranks share a GPU)."""
    collected = request.node.listchain()[0].items  # the run's root node holds every test
    others = [item.nodeid for item in collected
              if item.path != request.path and "jax_dist" in getattr(item, "fixturenames", ())]
    from jax._src import xla_bridge

    if others or jax.distributed.is_initialized() or xla_bridge.backends_are_initialized():
        pytest.skip("jax runs on CPU elsewhere in this process: run test_jax_gpu.py on its own")
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        pytest.skip(f"JAX_PLATFORMS={platforms}")
    if not _jax_has_cuda():
        pytest.skip("jax has no CUDA plugin (jax[cuda13])")
    port = free_port(comm)
    error = ""
    try:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=comm.size,
                                   process_id=comm.rank, initialization_timeout=120)
        devices = jax.local_devices()
        if len(devices) != 1 or devices[0].platform != "gpu":
            error = f"jax's local devices are {devices}, not one CUDA device"
    except Exception as e:  # the same answer on every rank, below
        error = f"jax.distributed.initialize: {type(e).__name__}: {e}"
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        pytest.skip(f"no CUDA device for jax on every rank: {errors[0]}")
    yield jax.local_devices()[0]
    comm.Barrier()
    jax.distributed.shutdown()


def data(name):
    shape, dtype, _ = ARRAYS[name]
    return pattern("jax_gpu/" + name, shape, dtype)


def mesh():
    return jax.sharding.Mesh(np.array(jax.devices()), ("x",))


def sharding(name):
    return NamedSharding(mesh(), P(*ARRAYS[name][2]))


def state():
    """Every array of ARRAYS on the device, sharded over every process (each
    builds its own shards)."""
    out = {}
    for name in ARRAYS:
        full = data(name)
        x = jax.make_array_from_callback(full.shape, sharding(name), lambda i, f=full: f[i])
        out[name] = x.block_until_ready()
    return out


_scribble = jax.jit(lambda a: jnp.full_like(a, 3), donate_argnums=0)


def donate_and_scribble(arrays) -> None:
    """Donates every local shard of every array to a computation that writes
    over it, deletes the arrays, and fills new device memory of the same
    sizes: whatever mhckpt still read from these buffers would be garbage."""
    shapes = []
    for x in arrays.values():
        for s in x.addressable_shards:
            shapes.append((s.data.shape, s.data.dtype, s.device))
            _scribble(s.data)
        if not x.is_deleted():
            x.delete()
    junk = [jnp.full(shape, 7, dtype=dtype, device=device) for shape, dtype, device in shapes]
    jax.block_until_ready(junk)


def same_bytes(got: np.ndarray, want: np.ndarray) -> bool:
    got = np.asarray(got)
    return (got.shape == want.shape and got.dtype == want.dtype
            and np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes())


def check_restored(comm, out, targets, what) -> None:
    """Every addressable shard of every restored array holds the saved bytes,
    in the target's sharding, on the device (collective over ``comm``)."""
    for name, t in targets.items():
        arr = out[name]
        all_ok(comm, arr.sharding == t.sharding, f"{what}: {name} sharding")
        all_ok(comm, all(s.device.platform == "gpu" for s in arr.addressable_shards),
               f"{what}: {name} on the device")
        full = data(name)
        ok = all(same_bytes(np.asarray(s.data), full[s.index]) for s in arr.addressable_shards)
        all_ok(comm, ok, f"{what}: {name} bytes")


def targets_like(shardings):
    return {name: jax.ShapeDtypeStruct(ARRAYS[name][0], np_dtype(ARRAYS[name][1]), sharding=s)
            for name, s in shardings.items()}


def test_the_device_path_is_taken(gpu):
    """A device shard goes to the core as a DLPack capsule with the legacy
    default stream (0), not through a host wait; a device target gets device
    buffers, not host arrays."""
    x = jnp.ones((4, 4), dtype=jnp.bfloat16, device=gpu)
    a = mjax.save_array("x", x)
    assert len(a.shards) == 1 and len(a.shards[0]) == 4, a.shards
    assert type(a.shards[0][2]).__name__ == "PyCapsule" and a.shards[0][3] == 0
    stored = {"dtype": "bfloat16", "shape": [4, 4]}
    r = mjax.restore_array("x", jax.ShapeDtypeStruct((4, 4), jnp.bfloat16,
                                                     sharding=SingleDeviceSharding(gpu)), stored)
    assert len(r.shards) == 1 and type(r.shards[0][2]).__name__ == "PyCapsule"
    assert r.shards[0][3] == 0


def test_save_waits_for_the_computation_that_defines_the_array(gpu, root, comm):
    """``save`` right after dispatching a long computation: the copy must wait
    for it on the device (the stream given to DLPack), not copy early."""
    steps, n = 3000, 1 << 20
    loop = jax.jit(lambda a: jax.lax.fori_loop(0, steps, lambda i, v: v + 1.0, a))
    x = loop(jnp.zeros(n, jnp.float32, device=gpu))  # still running
    with mhckpt.CheckpointManager(root, collective_timeout_seconds=120) as mgr:
        mgr.save(1, {"x": x})
        donate_and_scribble({"x": x})
        mgr.wait_until_finished()
        out = mgr.restore(1, {"x": jax.ShapeDtypeStruct((n,), jnp.float32,
                                                        sharding=SingleDeviceSharding(gpu))})
    all_ok(comm, bool((np.asarray(out["x"]) == steps).all()), "x holds the loop's final values")


def save_then_donate(mgr, lazy):
    """Saves state() as step 1, donates and scribbles over it right after
    save (after the fence with lazy), then waits for the commit."""
    arrays = state()
    fence = mgr.save(1, arrays, lazy=lazy)
    if lazy:
        fence.wait()
    donate_and_scribble(arrays)
    del arrays
    mgr.wait_until_finished()


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_sharded_save_donate_restore(gpu, root, comm, lazy):
    """Saved sharded over every process, donated right after save (after the
    fence with lazy), restored in the same and in another sharding."""
    with mhckpt.CheckpointManager(root, collective_timeout_seconds=120) as mgr:
        save_then_donate(mgr, lazy)
        same = targets_like({name: sharding(name) for name in ARRAYS})
        check_restored(comm, mgr.restore(1, same), same, "same sharding")
        other = targets_like({"bf16": NamedSharding(mesh(), P(None, "x")),
                              "f8": NamedSharding(mesh(), P("x")),
                              "f32": NamedSharding(mesh(), P()),
                              "rep": NamedSharding(mesh(), P())})
        check_restored(comm, mgr.restore(1, other), other, "other sharding")


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_saved_at_n_restored_at_one(gpu, root, comm, lazy):
    """N -> 1: saved sharded over the N >= 2 processes, restored by rank 0
    alone (a manager on a one-rank communicator), whole on its device."""
    if comm.size < 2:
        pytest.skip("saves at N >= 2 ranks and restores at 1: run at 2 ranks or more")
    with mhckpt.CheckpointManager(root, collective_timeout_seconds=120) as mgr:
        save_then_donate(mgr, lazy)
    one = comm.Split(0 if comm.rank == 0 else MPI.UNDEFINED, comm.rank)
    ok, why = True, ""
    if comm.rank == 0:
        try:
            with mhckpt.CheckpointManager(root, one, own_root=False) as m1:
                assert m1.describe(1)["world_size"] == comm.size
                whole = targets_like({name: SingleDeviceSharding(gpu) for name in ARRAYS})
                check_restored(one, m1.restore(1, whole), whole, f"{comm.size} -> 1")
        except Exception as e:  # reported on every rank below
            ok, why = False, f"{type(e).__name__}: {e}"
        finally:
            one.Free()
    all_ok(comm, ok, f"restore at 1 of a save at {comm.size}: {why}")
