"""Orbax's default preservation policy, as mhckpt's core applies it after
each commit: the best ``max_to_keep`` steps by ``best_fn`` (Orbax's ``BestN``)
or else the newest (``LatestN``), plus multiples of ``keep_period``
(``EveryNSteps``) and the steps ``keep_time_interval`` keeps
(``EveryNSeconds``). The manager decides here, at save time as Orbax does,
which steps its catalogue drops; the core deletes the same steps once the
save is committed."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Set


def metric_value(v: Any) -> Optional[float]:
    """A step's stored ``best_fn`` value as the core reads it: a number, or
    None (absent, not a number, NaN: "without metrics")."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return None
    return float(v)


def ranked(steps: Sequence[int], values: Dict[int, Optional[float]], best_mode: str) -> List[int]:
    """The steps that have a value, worst first and best last: Orbax's sort
    (``sorted`` by value, ``reverse`` for 'min', so that between equal
    values the later step ranks better)."""
    with_metric = [s for s in sorted(steps) if values.get(s) is not None]
    return sorted(with_metric, key=lambda s: values[s], reverse=(best_mode == "min"))


def kept_by_time(steps: Sequence[int], times: Dict[int, float], interval: float) -> Set[int]:
    """Orbax's EveryNSeconds: the oldest step, then each one created at least
    ``interval`` seconds after the last one kept so (``times``: seconds)."""
    out: Set[int] = set()
    last = None
    for s in sorted(steps):
        if last is None or times[s] - last >= interval:
            out.add(s)
            last = times[s]
    return out


def kept(steps: Sequence[int], values: Optional[Dict[int, Optional[float]]], *, max_to_keep: Optional[int],
         keep_period: Optional[int], best_mode: str, keep_without_metrics: bool,
         times: Optional[Dict[int, float]] = None, keep_time_interval: float = 0) -> Set[int]:
    """The steps the policy keeps. ``values``: each step's value (None:
    without metrics), or None for no ``best_fn``. ``max_to_keep`` None or 0
    keeps every step (mhckpt's core reads 0 as "all"). ``times``: each
    step's creation time in seconds, for ``keep_time_interval`` > 0."""
    steps = sorted(steps)
    if not max_to_keep or len(steps) <= max_to_keep:
        return set(steps)
    if values is None:
        keep = set(steps[-max_to_keep:])
    else:
        keep = set(ranked(steps, values, best_mode)[-max_to_keep:])
        if keep_without_metrics:
            keep |= {s for s in steps if values.get(s) is None}
    if keep_period:
        keep |= {s for s in steps if s % keep_period == 0}
    if keep_time_interval > 0 and times is not None:
        keep |= kept_by_time(steps, times, keep_time_interval)
    return keep
