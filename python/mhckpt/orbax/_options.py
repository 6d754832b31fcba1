"""``CheckpointManagerOptions`` and the options inside it, and the check of
an options object (ours or Orbax's own) when a manager is made."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from ._common import unsupported
from .checkpoint_managers import compile_policy


@dataclasses.dataclass
class AsyncOptions:
    """As Orbax's; ``timeout_secs`` bounds each collective phase of a save
    (mhckpt's ``collective_timeout_seconds``: the job is aborted past it)."""

    timeout_secs: int = 1200
    barrier_sync_fn: Any = None
    post_finalization_callback: Any = None
    create_directories_asynchronously: bool = True


@dataclasses.dataclass
class MultiprocessingOptions:
    """As Orbax's; only the defaults (every process takes part) are supported."""

    primary_host: Optional[int] = 0
    active_processes: Optional[set] = None
    barrier_sync_key_prefix: Optional[str] = None


@dataclasses.dataclass
class CheckpointManagerOptions:
    """Orbax's ``CheckpointManagerOptions``, field for field.

    Supported: ``save_interval_steps``, ``save_on_steps``, ``should_save_fn``,
    ``save_decision_policy`` (the policies of :mod:`mhckpt.orbax.checkpoint_managers`
    or Orbax's own, continuous checkpointing included), ``max_to_keep``, ``keep_period``,
    ``keep_time_interval`` (whole seconds of a ``timedelta``, as Orbax counts them),
    ``best_fn``, ``best_mode``, ``keep_checkpoints_without_metrics``, ``read_only``, ``create``,
    ``enable_async_checkpointing``, ``async_options.timeout_secs``,
    ``prevent_write_metrics``, and fields that change only how Orbax does its
    own bookkeeping (``cleanup_tmp_directories``: mhckpt always removes
    uncommitted steps when a manager opens; ``enable_background_delete``,
    ``num_deletion_threads``: mhckpt deletes in the background;
    ``single_host_load_and_broadcast``: mhckpt reads a box wanted by several
    processes once and sends it; ``save_root_metadata``,
    ``enable_should_save_is_saving_in_progress_check``). Any other field set
    to other than its default raises UnsupportedError when the manager is made.
    """

    save_interval_steps: int = 1
    max_to_keep: Optional[int] = None
    keep_time_interval: Any = None
    keep_period: Optional[int] = None
    best_fn: Optional[Callable[[Any], float]] = None
    best_mode: str = "max"
    keep_checkpoints_without_metrics: bool = True
    step_prefix: Optional[str] = None
    step_format_fixed_length: Optional[int] = None
    step_name_format: Any = None
    create: bool = True
    cleanup_tmp_directories: bool = False
    save_on_steps: Optional[Sequence[int]] = None
    single_host_load_and_broadcast: bool = False
    todelete_subdir: Optional[str] = None
    todelete_full_path: Optional[str] = None
    enable_background_delete: bool = False
    num_deletion_threads: Optional[int] = None
    read_only: bool = False
    enable_async_checkpointing: bool = True
    async_options: Optional[AsyncOptions] = None
    multiprocessing_options: MultiprocessingOptions = dataclasses.field(
        default_factory=MultiprocessingOptions)
    should_save_fn: Optional[Callable[[int, Optional[int]], bool]] = None
    file_options: Any = None
    atomicity_options: Any = None
    save_root_metadata: bool = True
    temporary_path_class: Any = None
    save_decision_policy: Any = None
    preservation_policy: Any = None
    prevent_write_metrics: bool = False
    enable_should_save_is_saving_in_progress_check: bool = True
    enable_per_process_directory_creation: bool = False
    lightweight_initialize: bool = False


_STEP_NAMES = ("mhckpt names every step directory step_<step, 10 digits> (its C++ core lists, commits, "
               "recovers and converts steps by that name); the step numbers are yours, only the "
               "directory names differ from Orbax's")

# field -> why it is not supported
_UNSUPPORTED_OPTIONS = {
    "step_prefix": _STEP_NAMES,
    "step_format_fixed_length": _STEP_NAMES,
    "step_name_format": _STEP_NAMES,
    "todelete_subdir": "old steps are deleted, not moved",
    "todelete_full_path": "old steps are deleted, not moved",
    "preservation_policy": "use max_to_keep, keep_period and best_fn",
    "temporary_path_class": "mhckpt commits with its own marker",
    "atomicity_options": "mhckpt commits with its own marker",
    "enable_per_process_directory_creation": "",
    "lightweight_initialize": "",
}


def check_options(o: Any) -> CheckpointManagerOptions:
    """Our options from ours or Orbax's own (any dataclass with these fields)."""
    if o is None:
        return CheckpointManagerOptions()
    if not dataclasses.is_dataclass(o):
        raise TypeError(f"options must be a CheckpointManagerOptions, not {type(o).__qualname__}")
    defaults = CheckpointManagerOptions()
    values = {}
    for f in dataclasses.fields(o):
        if not hasattr(defaults, f.name):
            raise unsupported(f"CheckpointManagerOptions.{f.name}")
        values[f.name] = getattr(o, f.name)
    for name, why in _UNSUPPORTED_OPTIONS.items():
        if name in values and values[name] != getattr(defaults, name):
            raise unsupported(f"CheckpointManagerOptions({name}={values[name]!r})", why)
    fo = values.get("file_options")
    if fo is not None and any(
        getattr(fo, k, None) not in (None, False)
        for k in ("path_permission_mode", "skip_sync_file_validations")
    ):
        raise unsupported(f"CheckpointManagerOptions(file_options={fo!r})")
    mp = values.get("multiprocessing_options")
    if mp is not None and (
        getattr(mp, "primary_host", 0) not in (0, None)
        or getattr(mp, "active_processes", None) is not None
        or getattr(mp, "barrier_sync_key_prefix", None) is not None
    ):
        raise unsupported(f"CheckpointManagerOptions(multiprocessing_options={mp!r})",
                          "every process of the job takes part, process 0 leads")
    ao = values.get("async_options")
    if ao is not None and (
        getattr(ao, "barrier_sync_fn", None) is not None
        or getattr(ao, "post_finalization_callback", None) is not None
    ):
        raise unsupported("AsyncOptions(barrier_sync_fn=..., post_finalization_callback=...)",
                          "wait_until_finished() returns once the step is committed")
    out = CheckpointManagerOptions(**values)
    if out.keep_time_interval is not None and not hasattr(out.keep_time_interval, "total_seconds"):
        raise TypeError(f"keep_time_interval must be a datetime.timedelta, not "
                        f"{type(out.keep_time_interval).__qualname__}")
    if out.best_mode not in ("min", "max"):
        raise ValueError('`best_mode` must be one of: "min", "max"')
    if out.save_interval_steps is not None and out.save_interval_steps < 0:
        raise ValueError("save_interval_steps must be >= 0")
    if out.save_decision_policy is not None:
        _, continuous = compile_policy(out.save_decision_policy)  # raises for what is not supported
        if continuous is not None and not out.enable_should_save_is_saving_in_progress_check:
            raise unsupported("ContinuousCheckpointingPolicy with "
                              "enable_should_save_is_saving_in_progress_check=False",
                              "a continuous save waits for the previous one to finish on every process")
    return out
