"""Orbax items in one mhckpt step, and the metadata that records them: tree
items are the top-level keys of the saved state; JSON items, metrics and
the layout of the items go into the commit marker's metadata under the
keys below (``python -m mhckpt convert`` writes them too)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .. import _leaves, _pytree
from .._errors import InvalidArgumentError, NotFoundError
from .._manager import CheckpointManager as _Manager
from ._common import DEFAULT_ITEM_NAME
from ._trees import (
    apply_save_args,
    args_by_name,
    as_sequences,
    cast,
    json_safe,
    restore_target,
    sequence_paths,
)


# Keys of the commit marker's metadata (mhckpt's user metadata) written here.
ITEMS_KEY = "orbax.items"  # {item name: "tree" | "json"}
SINGLE_KEY = "orbax.single"  # saved without item names (one "default" item)
JSON_KEY = "orbax.json"  # {item name: JSON item}
METRICS_KEY = "orbax.metrics"
BEST_KEY = "orbax.best"  # best_fn(metrics): the number the core's retention ranks steps by
SEQUENCES_KEY = "orbax.sequences"  # {item name: paths of its lists and tuples}
# {item name: {path: "dict" | "list" | "tuple"}}: the empty containers of a
# converted Orbax item (python -m mhckpt convert), given back by a restore
# without a target as real Orbax does.
EMPTY_KEY = "orbax.empty"


class Store:
    """Items <-> one mhckpt step: tree items are the top-level keys of the
    saved state, JSON items and Orbax's bookkeeping go into the marker."""

    def __init__(self, mgr: _Manager):
        self.mgr = mgr

    def save(self, step: int, items: Dict[str, Tuple[str, Any, Any]], single: bool,
             metrics: Any = None, best: Optional[float] = None) -> None:
        """items: {name: (kind, item, save_args)}; best: ``best_fn(metrics)``."""
        state: Dict[str, Any] = {}
        js: Dict[str, Any] = {}
        sequences: Dict[str, List[str]] = {}
        for name, (kind, item, save_args) in items.items():
            if kind == "json":
                js[name] = item
            else:
                state[name] = apply_save_args(name, item, save_args)
                seqs = sequence_paths(item, ())
                if seqs:
                    sequences[name] = seqs
        meta = {ITEMS_KEY: {n: k for n, (k, _, _) in items.items()}, SINGLE_KEY: single}
        if sequences:  # so that a restore without a target gives lists back
            meta[SEQUENCES_KEY] = sequences
        if js:
            meta[JSON_KEY] = json_safe("JSON item", js)
        if metrics is not None:
            meta[METRICS_KEY] = json_safe("metrics", metrics)
        if best is not None:
            meta[BEST_KEY] = best
        self.mgr.save(step, state, metadata=meta)

    def layout(self, step: int) -> Tuple[Dict[str, Any], Dict[str, str], bool]:
        desc = self.mgr.describe(step)
        items = desc["metadata"].get(ITEMS_KEY)
        if items is None:  # a step saved by mhckpt's own API: one item, the whole state
            return desc, {"": "tree"}, True
        return desc, items, bool(desc["metadata"].get(SINGLE_KEY))

    def restore(self, step: int, requests: Dict[str, Tuple[Any, Any, bool]]) -> Dict[str, Any]:
        """requests: {name: (target or None, restore_args, partial)}; the
        name "" is a whole mhckpt step. Returns {name: restored item}."""
        desc, items, _ = self.layout(step)
        arrays, values = desc["arrays"], desc["values"]
        out: Dict[str, Any] = {}
        combined: Dict[str, Any] = {}
        casts: Dict[str, Tuple[Any, List[Any]]] = {}
        for name, (target, restore_args, partial) in requests.items():
            kind = items.get(name)
            if kind is None:
                raise NotFoundError(f"step {step} has no item '{name}' (it has {sorted(items)})")
            if kind == "json":
                out[name] = desc["metadata"].get(JSON_KEY, {}).get(name)
                continue
            prefix = f"{name}/" if name else ""
            stored_names = {n[len(prefix):] for n in list(arrays) + list(values) if n.startswith(prefix)}
            whole = target is None
            if whole:
                target = _pytree.tree_of_names(stored_names)
            flat, treedef = _pytree.flatten(target, _leaves.is_leaf)
            names = [_pytree.path_name(p) for p, _ in flat]
            if not (partial or set(names) == stored_names or
                    _only_empty_nodes(target, stored_names - set(names), prefix, values, set(names) - stored_names)):
                missing, extra = sorted(stored_names - set(names)), sorted(set(names) - stored_names)
                raise InvalidArgumentError(
                    f"restore of item '{name or DEFAULT_ITEM_NAME}' at step {step}: the target's tree is "
                    f"not the stored one (stored leaves it lacks: {missing[:8]}; leaves not stored: "
                    f"{extra[:8]}); PyTreeRestore(partial_restore=True) restores a subset"
                )
            rargs = args_by_name(restore_args, name, "restore_args", set(names))
            leaves, dtypes = [], []
            for n, (_, leaf) in zip(names, flat):
                t, dt = restore_target(prefix + n, leaf, rargs.get(n), arrays.get(prefix + n))
                leaves.append(t)
                dtypes.append(dt)
            combined[name] = _pytree.unflatten(treedef, leaves)
            seqs = desc["metadata"].get(SEQUENCES_KEY, {}).get(name) if whole else None
            empties = desc["metadata"].get(EMPTY_KEY, {}).get(name) if whole else None
            casts[name] = (treedef, dtypes, seqs, empties)
        if combined:
            target = combined[""] if "" in combined else combined
            restored = self.mgr.restore(step, target)
            for name, (treedef, dtypes, seqs, empties) in casts.items():
                got, _ = _pytree.flatten(restored[name] if name else restored, _leaves.is_leaf)
                out[name] = _pytree.unflatten(treedef, [cast(x, dt) for (_, x), dt in zip(got, dtypes)])
                if empties:
                    out[name] = _with_empties(out[name], empties)
                if seqs:
                    out[name] = as_sequences(out[name], seqs)
        return out


def _only_empty_nodes(target: Any, unnamed: set, prefix: str, values: Dict[str, Any], extra: set) -> bool:
    """Whether the stored leaves the target does not name are all None
    values at or below an empty node of the target: Orbax records None, an
    empty namedtuple (optax's EmptyState, MaskedNode) and other leafless
    nodes alike as None, and restores any of them into the target's."""
    if extra or not all(prefix + n in values and values[prefix + n] is None for n in unnamed):
        return False

    def leafless(x: Any) -> bool:
        return x is not None and not _leaves.is_leaf(x) and not _pytree.flatten(x, _leaves.is_leaf)[0]

    flat, _ = _pytree.flatten(target, lambda x: _leaves.is_leaf(x) or leafless(x))
    empty = {_pytree.path_name(p) for p, x in flat if x is not None and leafless(x)}
    # An empty node holds the Nones Orbax recorded at or below it
    # (MaskedState(inner_state=EmptyState()) is leafless as a whole).
    return all(any(n == e or n.startswith(e + "/") for e in empty) for n in unnamed)


def _with_empties(tree: Any, empties: Dict[str, str]) -> Any:
    """``tree`` (nested dicts) with an empty dict, list or tuple at each path
    of ``empties``, shallowest first; the dicts above them made as needed."""
    make = {"dict": dict, "list": list, "tuple": tuple}
    if "" in empties and tree in (None, {}):
        return make[empties[""]]()
    for path in sorted((p for p in empties if p), key=lambda p: len(p.split("/"))):
        keys = path.split("/")
        node = tree
        for k in keys[:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(k, {})
        else:
            if isinstance(node, dict) and keys[-1] not in node:
                node[keys[-1]] = make[empties[path]]()
    return tree
