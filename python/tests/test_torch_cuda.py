"""torch CUDA tensors: save and restore are ordered with the current stream,
also a side stream (``with torch.cuda.stream(s):``) that still has work
queued. Each ordering test has a negative control that passes no stream
(the legacy default stream) and must see the race. bfloat16, float8 and
transposed tensors, written over right after save, restore bit for bit, also
saved sharded (DTensor) at N >= 2 ranks and restored at 1. Skipped without
CUDA."""
from __future__ import annotations

import numpy as np
import pytest

import mhckpt
from support import pattern

torch = pytest.importorskip("torch")
import mhckpt._torch as mtorch  # noqa: E402 (needs torch)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

# GPU cycles torch.cuda._sleep spins: a few hundred ms, far longer than the copies.
SPIN = 1_000_000_000
N = 1 << 20


@pytest.fixture
def device(comm):
    d = torch.device("cuda", comm.rank % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


@pytest.fixture
def no_stream(monkeypatch):
    """The negative control: mhckpt is given no stream (0, the legacy default
    stream), which does not wait for torch's side streams."""
    monkeypatch.setattr(mtorch, "stream_of", lambda t: 0)


def saved_while_a_side_stream_writes(mgr, device) -> np.ndarray:
    x = torch.zeros(N, device=device)
    torch.cuda.synchronize(device)
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN)
        x.fill_(7.0)  # the final values, still queued when save is called
        mgr.save(1, {"x": x})
        x.fill_(-1.0)  # donated at once
    mgr.wait_until_finished()
    return mgr.restore(1)["x"]


def test_save_waits_for_the_current_side_stream(mgr, device):
    assert (saved_while_a_side_stream_writes(mgr, device) == 7.0).all()


def test_save_without_the_stream_copies_too_early(mgr, device, no_stream):
    assert not (saved_while_a_side_stream_writes(mgr, device) == 7.0).all()


def restored_while_a_side_stream_writes(mgr, device):
    want = np.arange(N, dtype=np.float32)
    mgr.save(2, {"p": want})
    mgr.wait_until_finished()
    p = torch.nn.Parameter(torch.zeros(N, device=device))
    torch.cuda.synchronize(device)
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN)
        p.data.fill_(-1.0)  # the model still writes the parameter
        mgr.restore(2, {"p": p})
        after = p.detach().clone()  # queued after restore on the same stream
    torch.cuda.synchronize(device)
    return want, p.detach().cpu().numpy(), after.cpu().numpy()


def test_restore_waits_for_the_current_side_stream(mgr, device):
    want, got, after = restored_while_a_side_stream_writes(mgr, device)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(after, want)


def test_restore_without_the_stream_is_overwritten(mgr, device, no_stream):
    want, got, _ = restored_while_a_side_stream_writes(mgr, device)
    assert not np.array_equal(got, want)


def test_shards_carry_the_current_stream(device):
    x = torch.ones(4, device=device)
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        a = mtorch.save_array("x", x)
    assert a.shards[0][3] == side.cuda_stream
    assert mtorch.save_array("h", torch.ones(4)).shards[0][3] == 0


def test_a_bad_stream_is_an_agreed_error(mgr, device, comm):
    x = torch.ones(4, device=device)
    bad = [("x", "float32", [4], [([0], [4], x, "not a stream")])]
    with pytest.raises(mhckpt.InvalidArgumentError, match="stream"):
        mgr._impl.save(1, bad, {}, "", False, False, None, ("", ""))


# ------------------------------------------------------------------------
# bfloat16, float8 and transposed tensors on the device, written over right
# after save (after the fence with lazy=True), restored bit for bit on the
# device: at the same rank count, and saved sharded at N >= 2 ranks
# (DTensor) and restored at 1.

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}

# name -> (global shape, dtype, the dimension a DTensor shards)
SHARDED = {"bf16": ((16, 6), "bfloat16", 0), "f8": ((8, 10), "float8_e4m3fn", 1)}
BASE = (6, 10)  # "tt" is the transpose of a float32 tensor of this shape


def data(name, shape, dtype="float32"):
    return pattern("torch_cuda/" + name, shape, dtype)


def on_device(a: np.ndarray, dtype, device):
    """A device tensor of ``dtype`` with the bytes of numpy ``a`` (ml_dtypes
    for bfloat16 and float8, which torch.from_numpy does not take)."""
    a = np.ascontiguousarray(a)
    ints = a.view(np.uint8 if a.itemsize == 1 else np.dtype(f"i{a.itemsize}")).copy()
    return torch.from_numpy(ints).view(dtype).to(device)


def tensor_bytes(t) -> bytes:
    """The bytes of ``t`` (a DTensor: its local tensor), row-major."""
    t = t.to_local() if hasattr(t, "to_local") else t
    t = t.detach().contiguous()
    return t.view(_INT[t.element_size()]).cpu().numpy().tobytes()


def scribble(t) -> None:
    """Writes over every element of ``t`` (the local tensor of a DTensor;
    any strides), on the current stream."""
    t = t.to_local() if hasattr(t, "to_local") else t
    with torch.no_grad():
        t.detach().view(_INT[t.element_size()]).fill_(0x35)


def empty_like_saved(shape, dtype, device):
    t = torch.empty(shape, dtype=dtype, device=device)
    scribble(t)
    return t


def plain_state(device):
    """Replicated device tensors: bfloat16, float8 and a transposed float32."""
    state = {name: on_device(data(name, shape, dtype), getattr(torch, dtype), device)
             for name, (shape, dtype, _) in SHARDED.items()}
    state["tt"] = on_device(data("tt", BASE), torch.float32, device).t()
    assert not state["tt"].is_contiguous()
    return state


def restore_targets(device):
    """Device tensors of every saved shape, written over: bfloat16, float8,
    and a transposed (non-contiguous) float32 tensor."""
    t = {name: empty_like_saved(shape, getattr(torch, dtype), device)
         for name, (shape, dtype, _) in SHARDED.items()}
    t["tt"] = empty_like_saved(BASE, torch.float32, device).t()
    return t


def check_restored(out, targets) -> None:
    for name, (shape, dtype, _) in SHARDED.items():
        assert out[name] is targets[name] and out[name].device.type == "cuda"
        want = np.ascontiguousarray(data(name, shape, dtype)).tobytes()
        assert tensor_bytes(out[name]) == want, name
    assert out["tt"] is targets["tt"] and not out["tt"].is_contiguous()
    assert tensor_bytes(out["tt"]) == np.ascontiguousarray(data("tt", BASE).T).tobytes()


def save_and_scribble(mgr, state, lazy) -> None:
    fence = mgr.save(1, state, lazy=lazy)
    if lazy:
        fence.wait()
    for t in state.values():
        scribble(t)  # queued on the current stream at once: donated
    mgr.wait_until_finished()


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_low_precision_and_transposed_written_over_after_save(mgr, device, lazy):
    save_and_scribble(mgr, plain_state(device), lazy)
    targets = restore_targets(device)
    check_restored(mgr.restore(1, targets), targets)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_sharded_saved_at_n_restored_at_one(root, comm, device, torch_dist, lazy):
    """N -> 1: DTensors sharded over the N >= 2 ranks' devices (several ranks
    may share one GPU), restored by rank 0 alone (a manager on a one-rank
    communicator) into whole device tensors."""
    if comm.size < 2:
        pytest.skip("saves at N >= 2 ranks and restores at 1: run at 2 ranks or more")
    from mpi4py import MPI
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    from support import all_ok, dtensor_slice

    mesh = DeviceMesh(device.type, list(range(comm.size)))
    state = plain_state(device)
    for name, (shape, dtype, dim) in SHARDED.items():
        local = dtensor_slice(torch_dist, data(name, shape, dtype), Shard(dim))
        stride = torch.empty(shape, device="meta").stride()  # row-major
        state[name] = DTensor.from_local(on_device(local, getattr(torch, dtype), device), mesh,
                                         [Shard(dim)], run_check=False, shape=torch.Size(shape),
                                         stride=stride)
    with mhckpt.CheckpointManager(root, collective_timeout_seconds=120) as m:
        save_and_scribble(m, state, lazy)
    one = comm.Split(0 if comm.rank == 0 else MPI.UNDEFINED, comm.rank)
    ok, why = True, ""
    if comm.rank == 0:
        try:
            with mhckpt.CheckpointManager(root, one, own_root=False) as m1:
                assert m1.describe(1)["world_size"] == comm.size
                targets = restore_targets(device)
                check_restored(m1.restore(1, targets), targets)
        except Exception as e:  # reported on every rank below
            ok, why = False, f"{type(e).__name__}: {e}"
        finally:
            one.Free()
    all_ok(comm, ok, f"restore at 1 of a save at {comm.size}: {why}")
