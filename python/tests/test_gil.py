"""The GIL is released around every blocking call: another Python thread
(a data loader, a logger) keeps running while mhckpt copies, writes, reads
and checks bytes.

How it is measured: a background thread counts, sleeping 100 us between
counts (so it needs the GIL only for an instant and never keeps the main
thread waiting). The interpreter's switch interval is raised to 10 s for the
measurement, so the main thread never hands the GIL over on a timer: the
counter can only advance while the main thread has released the GIL itself.
If a call held the GIL, the counter would stand still across it.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from support import all_equal_bytes, all_ok

MIB = 1 << 20


class Counter:
    def __init__(self):
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.count += 1
            time.sleep(1e-4)

    def __enter__(self):
        self._thread.start()
        while self.count == 0:  # running before the first measurement
            time.sleep(1e-3)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@contextmanager
def no_timed_switches():
    old = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def measure(counter, call):
    """(counter advance, seconds) across ``call()``; no Python code that
    could release the GIL runs between the two readings and the call."""
    before, t0 = counter.count, time.perf_counter()
    result = call()
    after, t1 = counter.count, time.perf_counter()
    return after - before, t1 - t0, result


def test_gil_released_during_blocking_calls(comm, mgr):
    if comm.size != 1:
        pytest.skip("measured at 1 rank: the GIL is per process, and 128 MiB per rank is slow")
    big = np.random.default_rng(7).integers(0, 2**63, size=128 * MIB // 8, dtype=np.int64)
    want = big.copy()
    target = np.empty_like(big)
    results = {}
    with Counter() as counter, no_timed_switches():
        # Controls: a call that releases the GIL (sleep) gives the counter's
        # rate; one that holds it (summing a Python list) must not move it.
        results["sleep"] = measure(counter, lambda: time.sleep(0.05))
        spin = list(range(300_000))
        results["sum"] = measure(counter, lambda: sum(spin))
        results["save"] = measure(counter, lambda: mgr.save(1, {"big": big}))
        big[...] = 0  # mhckpt has its own copy now
        results["wait_until_finished"] = measure(counter, mgr.wait_until_finished)
        results["restore"] = measure(counter, lambda: mgr.restore(1, {"big": target}))
        results["verify"] = measure(counter, lambda: mgr.verify(1))
    report = {k: (adv, round(sec, 4)) for k, (adv, sec, _) in results.items()}
    rate = results["sleep"][0] / results["sleep"][1]
    assert rate > 100 and results["sum"][0] == 0, f"the measurement is broken: {report}"
    for call in ("save", "wait_until_finished", "restore", "verify"):
        advance, seconds, _ = results[call]
        assert seconds > 0.005, f"{call} took too little time to tell: {report}"
        # Released for the whole call, the counter runs near its rate (slower
        # when the call's own threads take the cores: 2% is the floor). A
        # call that released the GIL only around a short part of its work
        # would see a few counts at most.
        assert advance >= max(3, 0.02 * rate * seconds), f"{call} held the GIL: {report}"
    assert results["verify"][2] == big.nbytes
    all_equal_bytes(comm, target, want, "restored after the GIL test")


def test_gil_released_while_a_step_round_waits(comm, mgr):
    """reached_preemption waits (MPI_Wait) for the previous step's round while
    a rank is behind: the GIL is released meanwhile.

    Which call waits depends on the MPI library's progress: a non-blocking
    allreduce of more than two ranks may need the late rank to call into MPI
    before even the round it posted earlier completes. So the wait lands in
    the call for step 3 or in the one for step 4; the two are measured
    together."""
    if comm.size == 1:
        pytest.skip("needs a rank that is behind")
    assert not mgr.reached_preemption(1)
    assert not mgr.reached_preemption(2)
    with Counter() as counter, no_timed_switches():
        if comm.rank == 0:
            time.sleep(0.3)  # behind: the others wait for its rounds
        third = measure(counter, lambda: mgr.reached_preemption(3))
        fourth = measure(counter, lambda: mgr.reached_preemption(4))
    advance = third[0] + fourth[0]
    seconds = third[1] + fourth[1]
    all_ok(comm, third[2] is False and fourth[2] is False, "no notice")
    report = (advance, seconds)
    all_ok(comm, comm.rank == 0 or seconds > 0.1, f"did not wait: {report}")
    all_ok(comm, comm.rank == 0 or advance >= 3,
           f"reached_preemption held the GIL while waiting: {report}")
