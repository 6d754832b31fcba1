"""Orbax's save decision policies (``ocp.checkpoint_managers``), for
``CheckpointManagerOptions(save_decision_policy=...)``.

mhckpt.orbax takes these, or Orbax's own classes of the same names, and
decides itself: the step-based policies in Python (the same answer on every
process, from the step alone), ``ContinuousCheckpointingPolicy`` and
``PreemptionCheckpointingPolicy`` from the manager's per-step round
(:meth:`mhckpt.CheckpointManager.should_save`), which every process completes
alike. A policy of another class (a ``SaveDecisionPolicy`` of the program's
own) raises UnsupportedError when the manager is made: mhckpt does not build
Orbax's ``DecisionContext`` and ``PolicyCheckpointInfo`` for it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Container, Optional, Sequence

from ._common import unsupported


@dataclasses.dataclass
class FixedIntervalPolicy:
    """Saves at every step that is a multiple of ``interval``."""

    interval: int


@dataclasses.dataclass
class SpecificStepsPolicy:
    """Saves at the steps of ``steps``."""

    steps: Container[int]


@dataclasses.dataclass(kw_only=True)
class ContinuousCheckpointingPolicy:
    """Saves as often as the previous save allows: when it has finished on
    every process, and at least ``minimum_interval_secs`` after it started
    (None: at once)."""

    minimum_interval_secs: Optional[int] = None


class PreemptionCheckpointingPolicy:
    """Saves at the step :meth:`CheckpointManager.reached_preemption` agrees on."""

    def __repr__(self) -> str:
        return "PreemptionCheckpointingPolicy()"


class InitialSavePolicy:
    """Saves if the manager's directory holds no step yet."""

    def __repr__(self) -> str:
        return "InitialSavePolicy()"


@dataclasses.dataclass
class AnySavePolicy:
    """Saves if any of ``policies`` says so."""

    policies: Sequence[Any]


@dataclasses.dataclass
class Facts:
    """What a decision for one step is made from."""

    step: int
    last: Optional[int]         # the latest step, or None
    preemption: bool            # the agreed preemption step
    continuous: bool            # the manager's round says a continuous save may start


Decision = Callable[[Facts], bool]


def compile_policy(policy: Any) -> "tuple[Decision, Optional[float]]":
    """(a function of :class:`Facts` that decides as ``policy``, the
    ``minimum_interval_secs`` of its ContinuousCheckpointingPolicy (0.0 for
    None) or None if it has none). Policies are known by class name, so
    that Orbax's own instances work alike."""
    continuous: list = []

    def build(p: Any) -> Decision:
        kind = type(p).__name__
        if kind == "AnySavePolicy":
            parts = [build(q) for q in p.policies]
            return lambda f: any(part(f) for part in parts)
        if kind == "FixedIntervalPolicy":
            interval = int(p.interval)
            if interval <= 0:
                raise ValueError(f"FixedIntervalPolicy(interval={interval}): must be > 0")
            return lambda f: f.step % interval == 0
        if kind == "SpecificStepsPolicy":
            steps = p.steps
            return lambda f: f.step in steps
        if kind == "ContinuousCheckpointingPolicy":
            m = getattr(p, "minimum_interval_secs", None)
            continuous.append(0.0 if m is None else float(m))
            return lambda f: f.continuous
        if kind == "PreemptionCheckpointingPolicy":
            return lambda f: f.preemption
        if kind == "InitialSavePolicy":
            return lambda f: f.last is None
        raise unsupported(f"save_decision_policy of class {type(p).__qualname__}",
                          "AnySavePolicy of FixedIntervalPolicy, SpecificStepsPolicy, "
                          "ContinuousCheckpointingPolicy, PreemptionCheckpointingPolicy and "
                          "InitialSavePolicy are supported")

    decide = build(policy)
    if len(continuous) > 1 and len(set(continuous)) > 1:
        raise unsupported("two ContinuousCheckpointingPolicy with different minimum_interval_secs")
    return decide, (continuous[0] if continuous else None)


def default_policy(save_interval_steps: Optional[int], save_on_steps: Optional[Sequence[int]],
                   should_save_fn: Optional[Callable[[int, Optional[int]], bool]]) -> Decision:
    """Orbax's policy when ``save_decision_policy`` is None: ``should_save_fn``
    or the preemption step; else the interval, the listed steps, the
    preemption step or the first save."""
    if should_save_fn is not None:
        return lambda f: bool(should_save_fn(f.step, f.last)) or f.preemption
    steps = set(save_on_steps) if save_on_steps is not None else set()

    def decide(f: Facts) -> bool:
        if save_interval_steps and f.step % save_interval_steps == 0:
            return True
        return f.step in steps or f.preemption or f.last is None

    return decide


__all__ = [
    "AnySavePolicy",
    "ContinuousCheckpointingPolicy",
    "FixedIntervalPolicy",
    "InitialSavePolicy",
    "PreemptionCheckpointingPolicy",
    "SpecificStepsPolicy",
]
