"""torch CUDA tensors: save and restore are ordered with the current stream,
also a side stream (``with torch.cuda.stream(s):``) that still has work
queued. Each ordering test has a negative control that passes no stream
(the legacy default stream) and must see the race. Skipped without CUDA."""
from __future__ import annotations

import numpy as np
import pytest

import mhckpt

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
