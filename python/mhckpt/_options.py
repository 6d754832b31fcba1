"""The keyword arguments of ``mhckpt.CheckpointManager`` as the C++ core's
``Options`` (``coordinator/options.h``, which checks their ranges and agrees
on them across ranks).

Most arguments have the name of the ``Options`` field they set; the few that
do not (a choice given as a string, None for "unset", the preemption signals
that Python handles itself) are mapped here, and the rest copied by name.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from . import _core, _preemption


def core_options(settings: Dict[str, Any]) -> Tuple[Any, List[int], Dict[int, Any]]:
    """Returns ``(options, core_signals, chained)`` for the manager's keyword
    arguments ``settings``: the ``_core.Options``, the preemption signals
    whose handlers the core installs, and the signals that already have a
    Python handler, which mhckpt chains in Python (``_preemption.py``).
    Raises ValueError for a ``best_mode`` or ``files`` it does not know."""
    s = dict(settings)
    o = _core.Options()

    best_mode = s.pop("best_mode")
    if best_mode not in ("max", "min"):
        raise ValueError("best_mode=%r: want 'max' or 'min'" % (best_mode,))
    o.best_maximize = best_mode == "max"
    best_metric = s.pop("best_metric")
    o.best_metric = "" if best_metric is None else str(best_metric)
    o.keep_without_metric = bool(s.pop("keep_without_metric"))

    files = s.pop("files")
    if files == "one":
        o.ranks_per_file = 0
    elif files == "node":
        o.ranks_per_file = -1
    elif isinstance(files, int) and not isinstance(files, bool) and files > 0:
        o.ranks_per_file = files
    else:
        raise ValueError("files=%r: want 'one', 'node' or a positive int" % (files,))

    local_dir = s.pop("local_dir")
    o.local_dir = "" if local_dir is None else str(local_dir)
    node_id = s.pop("node_id")
    o.node_id = -1 if node_id is None else node_id

    core_signals: List[int] = []
    chained: Dict[int, Any] = {}
    signals = s.pop("preemption_signals")
    if s.pop("preemption"):
        core_signals, chained = _preemption.split_signals(signals)
    o.preemption_enabled = bool(core_signals)
    o.preemption_signals = core_signals

    for name, value in s.items():  # the rest: an Options field of that name
        if not hasattr(o, name):
            raise AssertionError(f"CheckpointManager({name}=): no such field in the core's Options")
        setattr(o, name, value)
    return o, core_signals, chained
