"""Preemption notices and the per-step save policy: a notice on one rank (a
signal, or mhckpt.notify_preemption) becomes the same step on every rank;
the step saved there records the notice; mhckpt.orbax's reached_preemption,
should_save and continuous policy on top. The restore of a preemption step
at another world size is test_reshard.py's."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, all_ok, block, pattern, raises_everywhere

NOTICE_AT = 3  # the step during which the notice arrives


def last_rank(comm) -> int:
    """The rank that gets the notice (rank 1 at 2 ranks, the last at 3)."""
    return comm.size - 1


def state_at(step: int, comm) -> dict:
    w = pattern(f"preempt/w{step}", (12, 3))
    start, count = block(12, comm.rank, comm.size)
    return {"w": mhckpt.Shard(w[start:start + count], offset=(start, 0), global_shape=w.shape),
            "step": step}


def run_loop(comm, mgr, notice, steps: int = 20):
    """A training loop: ``notice()`` on the last rank during step NOTICE_AT;
    saves when should_save says so, stops after saving the step
    reached_preemption is first True at. Returns [(step, should_save,
    reached)] and the steps saved."""
    seen, saved = [], []
    for step in range(steps):
        if step == NOTICE_AT and comm.rank == last_rank(comm):
            notice()
        save = mgr.should_save(step)
        reached = mgr.reached_preemption(step)
        assert mgr.reached_preemption(step) == reached  # the same step again: the same answer
        seen.append((step, save, reached))
        if save:
            mgr.save(step, state_at(step, comm))
            saved.append(step)
        if reached:
            mgr.wait_until_finished()
            break
    return seen, saved


def check_agreed(comm, seen, saved):
    """Every rank saw the same answers; the first True is one or two steps
    after the notice, and that step was saved."""
    everyone = comm.allgather(seen)
    all_ok(comm, all(s == everyone[0] for s in everyone), f"the ranks' answers differ: {everyone}")
    reached = [step for step, _, r in seen if r]
    assert reached, f"no preemption step: {seen}"
    p = reached[0]
    assert NOTICE_AT + 1 <= p <= NOTICE_AT + 2, f"notice during step {NOTICE_AT}, agreed at {p}"
    assert saved[-1] == p and all(s for step, s, _ in seen if step == p)
    return p


def check_record(mgr, p: int, grace: float, before_ms: int):
    d = mgr.describe(p)
    rec = d["preemption"]
    assert rec is not None, d
    assert rec["grace_seconds"] == grace
    assert before_ms <= rec["notice_unix_ms"] <= int(time.time() * 1000)
    assert 0 <= rec["saved_after_seconds"] < 120
    for s in mgr.all_steps():
        if s != p:
            assert mgr.describe(s)["preemption"] is None, s


def test_signal_on_one_rank(comm, root):
    """SIGUSR1 to the last rank only: every rank agrees on one step, saves it,
    and its marker records the notice; the handler before comes back."""
    before = signal.getsignal(signal.SIGUSR1)
    t0 = int(time.time() * 1000)
    with mhckpt.CheckpointManager(root, preemption=True, preemption_signals=[signal.SIGUSR1],
                                  preemption_grace_seconds=45, save_interval_steps=2,
                                  collective_timeout_seconds=120) as mgr:
        seen, saved = run_loop(comm, mgr, lambda: os.kill(os.getpid(), signal.SIGUSR1))
        p = check_agreed(comm, seen, saved)
        assert saved[:-1] == [s for s in range(0, p, 2)]  # the interval before it
        check_record(mgr, p, 45.0, t0)
        got = mgr.restore(p)
        all_equal_bytes(comm, got["w"], pattern(f"preempt/w{p}", (12, 3)), "the preemption step")
    assert signal.getsignal(signal.SIGUSR1) == before


def test_notify_on_one_rank(comm, root):
    """mhckpt.notify_preemption() on the last rank, no handlers installed."""
    with mhckpt.CheckpointManager(root, save_interval_steps=100, collective_timeout_seconds=120) as mgr:
        seen, saved = run_loop(comm, mgr, mhckpt.notify_preemption)
        p = check_agreed(comm, seen, saved)
        assert saved == [0, p]
        mhckpt.clear_preemption_notice()
        check_record(mgr, p, 0.0, 0)
        # Agreed once: later steps stay preempted, the save policy back to its interval.
        assert mgr.reached_preemption(p + 1) and not mgr.should_save(p + 1)


def test_python_handler_is_chained(comm, root):
    """A handler the program set with signal.signal before the manager opened
    still runs, after the notice is recorded, and is the handler again after
    close."""
    calls = []

    def handler(signum, frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with mhckpt.CheckpointManager(root, preemption=True, preemption_signals=[signal.SIGUSR1],
                                      collective_timeout_seconds=120) as mgr:
            assert signal.getsignal(signal.SIGUSR1) is not handler  # ours, calling it
            seen, saved = run_loop(comm, mgr, lambda: os.kill(os.getpid(), signal.SIGUSR1))
            check_agreed(comm, seen, saved)
        all_ok(comm, signal.getsignal(signal.SIGUSR1) is handler, "the handler is back")
        noticed = comm.rank == last_rank(comm)
        all_ok(comm, calls == ([signal.SIGUSR1] if noticed else []), f"handler calls {calls}")
        os.kill(os.getpid(), signal.SIGUSR1)  # the program's handler alone now
        for _ in range(100):
            if len(calls) == (2 if noticed else 1):
                break
            time.sleep(0.01)
        all_ok(comm, len(calls) == (2 if noticed else 1), f"handler calls after close {calls}")
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_python_handler_set_while_open_stays(comm, root):
    """A handler set with signal.signal while a manager holds the signal
    takes it over (no notice), and still runs after the manager closes (the
    core put back the C handler of before: Python's is set again)."""
    calls = []
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with mhckpt.CheckpointManager(root, preemption=True, preemption_signals=[signal.SIGUSR2],
                                      collective_timeout_seconds=120):
            signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
        os.kill(os.getpid(), signal.SIGUSR2)
        for _ in range(100):
            if calls:
                break
            time.sleep(0.01)
        all_ok(comm, calls == [signal.SIGUSR2], f"handler calls {calls}")
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_no_notice_and_the_interval(comm, root):
    """Without a notice: never preempted; should_save at the interval only;
    the record absent."""
    with mhckpt.CheckpointManager(root, save_interval_steps=7, collective_timeout_seconds=120) as mgr:
        t = time.perf_counter()
        answers = [(mgr.should_save(s), mgr.reached_preemption(s)) for s in range(100)]
        per_step = (time.perf_counter() - t) / 100
        assert answers == [(s % 7 == 0, False) for s in range(100)]
        mgr.save(99, state_at(99, comm))
        mgr.wait_until_finished()
        assert mgr.describe(99)["preemption"] is None
    if comm.rank == 0:
        print(f"should_save + reached_preemption: {per_step * 1e6:.1f} us per step at {comm.size} ranks")


def test_different_steps_raise_everywhere(comm, root):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    with mhckpt.CheckpointManager(root, collective_timeout_seconds=120) as mgr:
        assert not mgr.reached_preemption(5)
        assert not mgr.reached_preemption(6 + comm.rank)  # posted; decided from step 5's round
        raises_everywhere(comm, mhckpt.InvalidArgumentError, lambda: mgr.reached_preemption(20),
                          contains=["different steps", f"6 .. {5 + comm.size}"])


def test_continuous(comm, root):
    """save_continuously: a save when the previous one has finished on every
    rank; never two steps in a row (a save since the round decided from)."""
    with mhckpt.CheckpointManager(root, save_continuously=True, max_to_keep=2,
                                  collective_timeout_seconds=120) as mgr:
        saved = []
        for step in range(20):
            if mgr.should_save(step):
                mgr.save(step, state_at(step, comm))
                mgr.wait_until_finished()
                saved.append(step)
        everyone = comm.allgather(saved)
        all_ok(comm, all(s == saved for s in everyone), f"the ranks saved different steps: {everyone}")
        assert len(saved) >= 5, saved
        assert all(b - a >= 2 for a, b in zip(saved, saved[1:])), saved


# ------------------------------------------------------------------ mhckpt.orbax

def orbax_loop(comm, mngr, notice, steps: int = 20):
    """Orbax's loop: save (should_save inside), then reached_preemption."""
    ocp = pytest.importorskip("mhckpt.orbax")
    seen = []
    for step in range(steps):
        if step == NOTICE_AT and comm.rank == last_rank(comm):
            notice()
        x = {"x": np.arange(6, dtype=np.float32) + step}
        saved = mngr.save(step, args=ocp.args.StandardSave(x))
        reached = mngr.reached_preemption(step)
        seen.append((step, saved, reached))
        if reached:
            mngr.wait_until_finished()
            break
    return seen


def test_orbax_reached_preemption(comm, root):
    """mhckpt.orbax: reached_preemption is True at the agreed step only (JAX's
    sync point), should_save there too (Orbax's PreemptionCheckpointingPolicy),
    and the step saved restores."""
    ocp = pytest.importorskip("mhckpt.orbax")
    options = ocp.CheckpointManagerOptions(save_interval_steps=100)
    with ocp.CheckpointManager(root, options=options, preemption_signals=(signal.SIGUSR1,)) as mngr:
        assert not mngr.is_saving_in_progress()
        seen = orbax_loop(comm, mngr, lambda: os.kill(os.getpid(), signal.SIGUSR1))
        p = check_agreed(comm, seen, [s for s, saved, _ in seen if saved])
        assert [s for s, saved, _ in seen if saved] == [0, p]  # the first step, then the preemption's
        assert not mngr.is_saving_in_progress()
        assert not mngr.reached_preemption(p + 1) and not mngr.should_save(p + 1)
        assert mngr._mgr.describe(p)["preemption"] is not None
        got = mngr.restore(p, args=ocp.args.StandardRestore({"x": np.zeros(6, np.float32)}))
        all_equal_bytes(comm, got["x"], np.arange(6, dtype=np.float32) + p, "orbax preemption step")


def test_orbax_continuous_policy(comm, root):
    """save_decision_policy=ContinuousCheckpointingPolicy (with the preemption
    policy): saves whenever the previous one has finished, and the
    preemption step."""
    ocp = pytest.importorskip("mhckpt.orbax")
    cm = ocp.checkpoint_managers
    policy = cm.AnySavePolicy([cm.ContinuousCheckpointingPolicy(), cm.PreemptionCheckpointingPolicy()])
    options = ocp.CheckpointManagerOptions(save_decision_policy=policy, max_to_keep=3,
                                           enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=options, preemption_signals=None) as mngr:
        seen = orbax_loop(comm, mngr, mhckpt.notify_preemption)
        saved = [s for s, ok, _ in seen if ok]
        p = check_agreed(comm, seen, saved)
        assert len(saved) >= 2 and saved[-1] == p, saved
        assert all(b - a >= 2 for a, b in zip(saved[:-1], saved[1:-1])), saved
    # Without the preemption policy the agreed step is no reason to save by itself.
    options = ocp.CheckpointManagerOptions(save_decision_policy=cm.FixedIntervalPolicy(50))
    with ocp.CheckpointManager(os.path.join(root, "fixed"), options=options, preemption_signals=None) as mngr:
        mhckpt.clear_preemption_notice()
        seen = orbax_loop(comm, mngr, mhckpt.notify_preemption)
        assert [s for s, ok, _ in seen if ok] == [0] and seen[-1][2], seen


def test_orbax_policy_classes(comm, root):
    """Orbax's own policy objects are taken alike; one of another class is
    refused when the manager is made."""
    ocp = pytest.importorskip("mhckpt.orbax")
    from mhckpt.orbax.checkpoint_managers import Facts, compile_policy

    class Mine:
        def should_save(self, step, previous_steps, *, context):
            return True

    with pytest.raises(mhckpt.UnsupportedError, match="Mine"):
        ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(save_decision_policy=Mine()))
    with pytest.raises(mhckpt.UnsupportedError, match="enable_should_save_is_saving_in_progress_check"):
        ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(
            save_decision_policy=ocp.checkpoint_managers.ContinuousCheckpointingPolicy(),
            enable_should_save_is_saving_in_progress_check=False))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        from orbax.checkpoint import checkpoint_managers as real
    except Exception:  # noqa: BLE001 -- Orbax absent or not importable here
        return
    decide, continuous = compile_policy(real.AnySavePolicy([
        real.SpecificStepsPolicy([3]), real.ContinuousCheckpointingPolicy(minimum_interval_secs=5),
        real.InitialSavePolicy()]))
    assert continuous == 5.0
    assert decide(Facts(step=3, last=1, preemption=False, continuous=False))
    assert decide(Facts(step=4, last=None, preemption=False, continuous=False))
    assert not decide(Facts(step=4, last=1, preemption=True, continuous=False))
    assert decide(Facts(step=4, last=1, preemption=False, continuous=True))
