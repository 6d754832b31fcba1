"""What ``mhckpt.CheckpointManager`` hands the C++ core and reads back from
it: the checks of a save's arrays, the commit marker's user metadata (the
caller's, and the non-array leaves as JSON) both ways, and the plan of a
restore (one entry per leaf of the target)."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import _leaves, _pytree
from ._errors import InvalidArgumentError

# Keys of the commit marker's user metadata that this package owns.
VALUES_KEY = "mhckpt.python.values"
RESERVED_PREFIX = "mhckpt."


def donation_check(keep: List[Any], jax_arrays: List[Any]):
    """What a lazy save calls on mhckpt's copying thread once it has copied:
    a jax.Array deleted by then (donated to a computation, or deleted) may
    have been overwritten during the copy, so the save must fail. ``keep``
    holds every saved leaf and every buffer object made from one (the
    temporaries of ``_leaves.save_array``) until then, so that none is freed
    under the copy; it is emptied here, when the copy has ended. (A copy that
    failed does not call the check: ``keep`` then goes with the check itself,
    which the copying thread drops once the copy has ended; the binding holds
    the buffers it took until then too.)"""

    def check() -> Optional[str]:
        try:
            for name, leaf in jax_arrays:
                if leaf.is_deleted():
                    return (f"array '{name}': the jax.Array was donated or deleted before the "
                            "lazy save had copied it (call .wait() on the save's fence before "
                            "the step that donates it)")
            return None
        finally:
            keep.clear()
            jax_arrays.clear()

    return check


def check_no_array_is_a_group(names: List[str]) -> None:
    """An array named like a path prefix of another (keys "a" and "a/b", or
    "a" beside {"a": {"b": ...}} one level up) would be both a dataset and a
    group of the checkpoint file: refused here, at save, rather than by the
    core's plan once the save has started."""
    groups: Dict[str, str] = {}
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            groups.setdefault("/".join(parts[:i]), name)
    for name in names:
        if name in groups:
            raise InvalidArgumentError(
                f"array '{name}': another array, '{groups[name]}', is named below it; "
                "a name cannot be both an array and a group of arrays"
            )


def encode_metadata(metadata: Optional[Mapping[str, Any]], values: Dict[str, Any]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or k.startswith(RESERVED_PREFIX):
            raise InvalidArgumentError(
                f"metadata key {k!r}: keys are strings not starting with '{RESERVED_PREFIX}'"
            )
        if not _leaves.is_utf8(k):
            raise InvalidArgumentError(f"metadata key {k!r}: not encodable as UTF-8")
        out[k] = _json(f"metadata '{k}'", v)
    if values:
        out[VALUES_KEY] = _json("non-array leaves", values)
    return out


def _json(what: str, v: Any) -> str:
    try:
        # ASCII only: the marker stays valid UTF-8 whatever the strings hold.
        return json.dumps(v, ensure_ascii=True, allow_nan=True, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: not JSON-serializable ({e})") from None


def decode_description(d: Dict[str, Any]) -> Dict[str, Any]:
    """The core's description of a step (``_core.Manager.describe``) as
    ``CheckpointManager.describe`` returns it: arrays by name, the values,
    and the user metadata decoded from JSON."""
    user = dict(d.pop("user_metadata"))
    values = json.loads(user.pop(VALUES_KEY, "{}"))
    metadata = {}
    for k, v in user.items():
        try:
            metadata[k] = json.loads(v)
        except ValueError:  # written by the C++ API: plain text
            metadata[k] = v
    d["arrays"] = {a.pop("name"): a for a in d["arrays"]}
    d["values"] = values
    d["metadata"] = metadata
    return d


def plan_restore(
    desc: Dict[str, Any], target: Any, strict: bool, step: int
) -> Tuple[Any, List[Any], List[Optional[str]]]:
    """Plans a restore of ``target`` (None: every array and value of
    ``desc``) from the step ``desc`` describes. Returns ``(treedef, plans,
    names)``, one entry per leaf: an array leaf has its restore plan and name
    None, a non-array leaf plan None and the name of its value in
    ``desc["values"]``. Raises NotFoundError for a leaf the step lacks and,
    when ``strict``, InvalidArgumentError for a target that leaves out an
    array; ``step`` names the step in both."""
    if target is None:
        # Nested dicts of None leaves for every array and value of the step.
        target = _pytree.tree_of_names(list(desc["arrays"]) + list(desc["values"]))
    flat, treedef = _pytree.flatten(target, _leaves.is_leaf)
    plans: List[Any] = []
    names: List[Optional[str]] = []
    wanted = set()
    for path, leaf in flat:
        name = _pytree.path_name(path)
        stored = desc["arrays"].get(name)
        if stored is None:
            if name not in desc["values"]:
                raise _leaves.not_found(name, step)
            plans.append(None)
            names.append(name)
            continue
        wanted.add(name)
        plans.append(_leaves.restore_array(name, leaf, stored))
        names.append(None)
    if strict and wanted != set(desc["arrays"]):
        missing = sorted(set(desc["arrays"]) - wanted)
        raise InvalidArgumentError(
            f"strict restore of step {step}: the target leaves out {missing}"
        )
    return treedef, plans, names
