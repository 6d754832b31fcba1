"""Preemption notices from Python: ``notify_preemption`` and the signals a
manager opened with ``preemption=True`` listens to.

The C++ core installs its handlers with ``sigaction`` and chains nothing: the
handler in place before is not called while the manager is open, and comes
back when it closes. That would silently replace a handler the program set
with ``signal.signal``: Python's own C-level handler, which runs the Python
function later on the main thread, is what ``sigaction`` replaces, while
``signal.getsignal`` still names the function. So a signal that already has a
Python handler is not given to the core: it gets a Python handler that
records the notice and then calls the program's handler, and the program's
handler comes back when the manager closes. Such a notice is recorded when
the main thread next runs Python code (at the latest, at its next call of
``reached_preemption``), not at once; the other signals are the core's.
"""
from __future__ import annotations

import signal
import threading
import warnings
from typing import Any, Callable, Dict, List, Sequence, Tuple

from . import _core

DEFAULT_SIGNALS: Tuple[int, ...] = (int(signal.SIGTERM), int(signal.SIGUSR1))


def notify_preemption() -> None:
    """Records a preemption notice in this process (local, any thread): every
    manager of the process sees it at its next :meth:`reached_preemption`
    round, and every rank of a manager then agrees on the step to save. For
    a handler of your own (a signal, or a thread that polls a cloud
    provider's metadata server for a spot VM's notice). The earliest
    notice's time is kept, for the record in the saved step."""
    _core.notify_preemption()


def clear_preemption_notice() -> None:
    """Forgets this process's notice (local): for a job that chose to go on,
    or a test. A manager that has already agreed on a preemption step keeps
    it."""
    _core.clear_preemption_notice()


def _is_python_handler(handler: Any) -> bool:
    """A handler the program set with ``signal.signal`` (not SIG_DFL, SIG_IGN,
    Python's KeyboardInterrupt handler of SIGINT, nor None: a handler
    installed outside Python)."""
    return callable(handler) and handler is not signal.default_int_handler


class PythonChain:
    """The Python handlers of one manager: for each signal that had a Python
    handler, a handler that records the notice and calls that one. And for
    the core's signals, what Python's table said at open: a Python handler
    set while the manager was open replaced the core's (so the notices of
    that signal went to it), and the core, closing, puts back the C handler
    of before; Python's is then set again, so that it runs as
    ``signal.getsignal`` says."""

    def __init__(self) -> None:
        self._installed: List[Tuple[int, Callable, Any]] = []  # (signal, ours, theirs)
        self._core: Dict[int, Any] = {}  # the core's signals: Python's handler at open

    def note_core(self, signals: Sequence[int]) -> None:
        for sig in signals:
            try:
                self._core[sig] = signal.getsignal(sig)
            except ValueError:
                pass

    def install(self, chained: Dict[int, Any]) -> None:
        for sig, theirs in chained.items():
            def ours(signum, frame, _theirs=theirs):
                _core.notify_preemption()
                return _theirs(signum, frame)

            signal.signal(sig, ours)
            self._installed.append((sig, ours, theirs))

    def restore(self) -> None:
        """Puts back each program handler whose place still holds ours (a
        handler set since stays; ours, left under it, only records notices
        and calls the program's)."""
        installed, self._installed = self._installed, []
        core, self._core = self._core, {}
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal works on the main thread only: ours stay, harmless
        for sig, ours, theirs in reversed(installed):
            if signal.getsignal(sig) is ours:
                signal.signal(sig, theirs)
        for sig, at_open in core.items():
            now = signal.getsignal(sig)
            if now is not at_open and _is_python_handler(now):
                signal.signal(sig, now)


def split_signals(signals: Sequence[int]) -> Tuple[List[int], Dict[int, Any]]:
    """(the signals the core installs handlers for, {signal: program handler}
    for those that keep a Python handler chained after the notice). Off the
    main thread ``signal.signal`` cannot be called: a signal with a Python
    handler then goes to the core too, with a warning that its handler does
    not run while the manager is open."""
    core: List[int] = []
    chained: Dict[int, Any] = {}
    main = threading.current_thread() is threading.main_thread()
    for s in signals:
        sig = int(s)
        if sig in core or sig in chained:
            continue
        try:
            handler = signal.getsignal(sig)
        except ValueError:  # not a signal number: the core says which
            core.append(sig)
            continue
        if not _is_python_handler(handler):
            core.append(sig)
        elif main:
            chained[sig] = handler
        else:
            warnings.warn(
                f"mhckpt: preemption handling replaces the Python handler of {signal.Signals(sig).name} "
                f"({handler!r}) until the manager closes: the manager was opened off the main thread, "
                "where signal.signal cannot chain it. Open it on the main thread, or leave the signal out "
                "of preemption_signals and call mhckpt.notify_preemption() from your handler.",
                RuntimeWarning,
                stacklevel=3,
            )
            core.append(sig)
    return core, chained
