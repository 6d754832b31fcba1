"""The readers of ``python -m mhckpt convert`` (mhckpt/_convert.py): an Orbax
step, a torch.distributed.checkpoint directory or safetensors files as a
:class:`Source` of arrays and values by mhckpt name (the rule of naming is
in _convert's docstring), and the copies between torch tensors and numpy
arrays that the conversions make."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _leaves
from ._errors import InvalidArgumentError, NotFoundError
from .orbax._common import DEFAULT_ITEM_NAME
from .orbax._store import EMPTY_KEY, ITEMS_KEY, JSON_KEY, SEQUENCES_KEY, SINGLE_KEY
from .orbax._trees import sequence_paths

INDEX = "model.safetensors.index.json"  # the index of a directory of safetensors files
VALUES_META = "mhckpt.values"  # the safetensors metadata key of an mhckpt step's values
DCP_EMPTY_KEY = "dcp.empty"  # step metadata: {name: "dict" | "list" | "tuple"} of a DCP checkpoint's empties


class Source:
    """What a reader gives: arrays by name (shape, dtype name), values by
    name, mhckpt metadata, and a function reading one array whole."""

    def __init__(self):
        self.arrays: Dict[str, Tuple[Tuple[int, ...], str]] = {}
        self.values: Dict[str, Any] = {}
        self.metadata: Dict[str, Any] = {}
        self.step: Optional[int] = None
        # Arrays read whole while the source was opened (every rank holds them).
        self.inline: Dict[str, np.ndarray] = {}

    def read(self, names: List[str]) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def add_inline(self, name: str, a: np.ndarray) -> None:
        self.arrays[name] = (tuple(a.shape), _leaves.numpy_dtype_name(name, a.dtype))
        self.inline[name] = a


EMPTY_KINDS = {dict: "dict", list: "list", tuple: "tuple"}


def _add_value(src: Source, name: str, v: Any, empties: Dict[str, str]) -> None:
    """A plain value, or a tree of them named further by its path; an empty
    dict, list or tuple is recorded in ``empties`` (name -> its kind), a
    tensor or numpy array or scalar is an array held inline."""
    if isinstance(v, (dict, list, tuple)) and not hasattr(type(v), "_fields") and len(v) == 0:
        empties[name] = EMPTY_KINDS[dict if isinstance(v, dict) else list if isinstance(v, list) else tuple]
    elif isinstance(v, dict):
        for k, x in v.items():
            _add_value(src, f"{name}/{k}", x, empties)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _add_value(src, f"{name}/{i}", x, empties)
    elif _leaves.is_value(v):
        src.values[name] = v
    elif _leaves.is_torch_tensor(v):
        src.add_inline(name, torch_to_numpy(v))
    elif isinstance(v, (np.ndarray, np.generic)):
        src.add_inline(name, np.array(v))
    else:
        raise InvalidArgumentError(
            f"'{name}': a {type(v).__module__}.{type(v).__qualname__} is neither an array nor a plain value "
            "(None, bool, int, float, str)"
        )


# ---------------------------------------------------------------- orbax in


def is_orbax_item(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in ("_METADATA", "manifest.ocdbt", "_sharding"))


def _is_orbax_json_item(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "metadata")) and not is_orbax_item(path)


def is_orbax_step(path: str) -> bool:
    if os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")):
        return True
    return any(is_orbax_item(os.path.join(path, d)) for d in subdirs(path))


def subdirs(path: str) -> List[str]:
    return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))


class OrbaxSource(Source):
    def __init__(self, path: str, step: Optional[int]):
        super().__init__()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import orbax.checkpoint as ocp

        self._ocp = ocp
        if not is_orbax_step(path) and not is_orbax_item(path):  # a root of numbered steps
            steps = sorted(int(d) for d in subdirs(path)
                           if d.isdigit() and is_orbax_step(os.path.join(path, d)))
            if not steps:
                raise NotFoundError(f"{path}: no Orbax step, item or root of steps")
            if step is None:
                step = steps[-1]
            elif step not in steps:
                raise NotFoundError(f"{path}: no Orbax step {step} (steps: {steps})")
            path = os.path.join(path, str(step))
        base = os.path.basename(os.path.normpath(path))
        if is_orbax_item(path):  # one item alone: names are its tree paths, a plain step
            items = {"": path}
        else:
            items = {d: os.path.join(path, d) for d in subdirs(path)
                     if is_orbax_item(os.path.join(path, d)) or _is_orbax_json_item(os.path.join(path, d))}
            if not items:
                raise NotFoundError(f"{path}: an Orbax step without items")
            kinds = {d: "tree" if is_orbax_item(p) else "json" for d, p in items.items()}
            self.metadata = {ITEMS_KEY: kinds, SINGLE_KEY: list(kinds) == [DEFAULT_ITEM_NAME]}
            if base.isdigit():
                self.step = int(base)
        self._where: Dict[str, Tuple[str, Tuple[Any, ...]]] = {}  # name -> (item dir, tree path)
        self._meta_trees: Dict[str, Any] = {}
        json_items = {}
        for item, ipath in items.items():
            if not is_orbax_item(ipath):
                json_items[item] = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(ipath)
                continue
            self._read_tree_metadata(item, ipath)
        if json_items:
            self.metadata[JSON_KEY] = json_items

    def _read_tree_metadata(self, item: str, ipath: str) -> None:
        """The item's leaves from Orbax's metadata tree (nested dicts and
        lists, namedtuples as dicts): arrays; None (what Orbax records for
        None and for every empty node: optax's EmptyState and MaskedNode
        too) as a None value; Python scalars and strings, read here, as
        values; empty dicts, lists and tuples recorded under EMPTY_KEY."""
        ocp = self._ocp
        meta = ocp.PyTreeCheckpointer().metadata(ipath)
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        self._meta_trees[ipath] = tree
        seqs = sequence_paths(tree, ())
        if seqs:  # mhckpt.orbax gives lists back where the tree had them
            self.metadata.setdefault(SEQUENCES_KEY, {})[item] = seqs
        prefix = f"{item}/" if item else ""
        empties: Dict[str, str] = {}
        plain: List[Tuple[str, Tuple[Any, ...], Any]] = []  # scalars and strings: read below

        def walk(node: Any, keys: Tuple[Any, ...]) -> None:
            path = "/".join(str(k) for k in keys)
            name = prefix + path if keys else prefix.rstrip("/") or "value"
            if isinstance(node, (dict, list, tuple)):
                if not node:
                    empties[path] = EMPTY_KINDS[type(node) if type(node) in EMPTY_KINDS else dict]
                items = node.items() if isinstance(node, dict) else enumerate(node)
                for k, v in items:
                    walk(v, keys + (k,))
            elif node is None:
                self.values[name] = None
            elif isinstance(node, (ocp.metadata.ScalarMetadata, ocp.metadata.StringMetadata)):
                plain.append((name, keys, node))
            elif hasattr(node, "shape") and hasattr(node, "dtype"):
                self.arrays[name] = (tuple(int(s) for s in node.shape), _leaves.numpy_dtype_name(name, node.dtype))
                self._where[name] = (ipath, keys)
            else:
                raise InvalidArgumentError(f"'{name}': Orbax metadata {node!r} is neither an array's nor a value's")

        walk(tree, ())
        if empties:  # mhckpt.orbax gives them back in a restore without a target
            self.metadata.setdefault(EMPTY_KEY, {})[item] = empties
        if plain:
            self._read_plain(ipath, plain)

    def _read_plain(self, ipath: str, plain: List[Tuple[str, Tuple[Any, ...], Any]]) -> None:
        """Python scalars and strings of an item, as Orbax restores them
        (int, float, bool, str), on every rank."""
        ocp = self._ocp
        target: Dict[Any, Any] = {}
        rargs: Dict[Any, Any] = {}
        for _, keys, m in plain:
            _put(target, keys, "" if isinstance(m, ocp.metadata.StringMetadata) else 0)
            _put(rargs, keys, ocp.RestoreArgs())
        _lists_like(target, self._meta_trees[ipath])
        _lists_like(rargs, self._meta_trees[ipath])
        got = ocp.PyTreeCheckpointer().restore(
            ipath, args=ocp.args.PyTreeRestore(target, restore_args=rargs, partial_restore=True))
        for name, keys, m in plain:
            v = _get(got, keys)
            if isinstance(m, ocp.metadata.StringMetadata):
                v = str(v)
            else:
                kind = np.dtype(m.dtype).kind
                v = bool(v) if kind == "b" else int(v) if kind in "iu" else float(v)
            self.values[name] = v

    def read(self, names: List[str]) -> Dict[str, np.ndarray]:
        ocp = self._ocp
        by_item: Dict[str, List[str]] = {}
        for n in names:
            by_item.setdefault(self._where[n][0], []).append(n)
        out = {}
        for ipath, ns in by_item.items():
            target: Dict[Any, Any] = {}
            rargs: Dict[Any, Any] = {}
            for n in ns:
                keys = self._where[n][1]
                shape, dtype = self.arrays[n]
                _put(target, keys, np.empty(shape, _leaves.numpy_dtype(dtype)))
                _put(rargs, keys, ocp.RestoreArgs(restore_type=np.ndarray))
            _lists_like(target, self._meta_trees[ipath])
            _lists_like(rargs, self._meta_trees[ipath])
            got = ocp.PyTreeCheckpointer().restore(
                ipath, args=ocp.args.PyTreeRestore(target, restore_args=rargs, partial_restore=True))
            for n in ns:
                x = got
                for k in self._where[n][1]:
                    x = x[k]
                out[n] = np.asarray(x)
        return out


def _put(tree: Dict[Any, Any], keys: Tuple[Any, ...], leaf: Any) -> None:
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = leaf


def _lists_like(tree: Dict[Any, Any], like: Any) -> None:
    """Turns the dicts of ``tree`` that stand where ``like`` has lists or
    tuples into lists (with every index; unread ones None)."""
    for k, v in list(tree.items()):
        sub = like[k] if isinstance(like, (dict, list, tuple)) else None
        if isinstance(v, dict):
            _lists_like(v, sub)
            if isinstance(sub, (list, tuple)):
                tree[k] = [v.get(i) for i in range(len(sub))]


# ------------------------------------------------------------------ dcp in


class DcpSource(Source):
    def __init__(self, path: str):
        super().__init__()
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata

        self._path = path
        self._meta = FileSystemReader(path).read_metadata()
        planner = self._meta.planner_data or {}
        self._keys: Dict[str, Tuple[Any, ...]] = {}
        self._fqn: Dict[str, str] = {}
        byte_keys = []
        for fqn, md in self._meta.state_dict_metadata.items():
            keys = tuple(planner.get(fqn, (fqn,)))
            name = "/".join(str(k) for k in keys)
            if isinstance(md, BytesStorageMetadata):
                byte_keys.append((fqn, keys, name))
                continue
            self.arrays[name] = (tuple(int(s) for s in md.size), _torch_dtype_name(name, md.properties.dtype))
            self._keys[name] = keys
            self._fqn[name] = fqn
        if byte_keys:  # plain values: small, every rank reads them (values are rank 0's)
            sd: Dict[Any, Any] = {}
            for fqn, keys, _ in byte_keys:
                _put_dcp(sd, keys, None)
            self._load(sd)
            empties: Dict[str, str] = {}
            for fqn, keys, name in byte_keys:
                _add_value(self, name, _get(sd, keys), empties)
            if empties:  # so that nothing of the state dict is lost (mhckpt.torch loads into its own)
                self.metadata[DCP_EMPTY_KEY] = empties

    def _load(self, sd: Dict[Any, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        dcp.load(sd, storage_reader=FileSystemReader(self._path), no_dist=True)

    def read(self, names: List[str]) -> Dict[str, np.ndarray]:
        inline = {n: self.inline[n] for n in names if n in self.inline}
        out = self._read([n for n in names if n not in self.inline])
        out.update(inline)
        return out

    def _read(self, names: List[str]) -> Dict[str, np.ndarray]:
        """The arrays, each loaded as DCP's FileSystemReader loads its items
        (``torch.load`` of the item's slice of its file), file by file in
        the order of the bytes. An array saved whole is the tensor loaded,
        not copied; one saved in chunks is assembled from them. Items with
        storage transforms go through ``dcp.load``."""
        import torch
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import MetadataIndex

        reader = FileSystemReader(self._path)
        items: Dict[str, List[Tuple[int, str, Any, Any]]] = {}  # file -> (offset, name, chunk, info)
        through_dcp = []
        for n in names:
            md = self._meta.state_dict_metadata[self._fqn[n]]
            infos = [(c, self._meta.storage_data[MetadataIndex(self._fqn[n], c.offsets)]) for c in md.chunks]
            if any(info.transform_descriptors for _, info in infos):
                through_dcp.append(n)
                continue
            for c, info in infos:
                items.setdefault(info.relative_path, []).append((info.offset, n, c, info))
        out: Dict[str, Any] = {}
        for rel, reqs in items.items():
            with open(os.path.join(self._path, rel), "rb") as f:
                for _, n, c, info in sorted(reqs, key=lambda r: r[0]):
                    t = torch.load(reader._slice_file(f, info), map_location="cpu", weights_only=True)
                    shape, dtype = self.arrays[n]
                    whole = tuple(c.sizes) == shape and not any(c.offsets)
                    if whole and tuple(t.shape) == shape and t.dtype == getattr(torch, dtype):
                        out[n] = t
                        continue
                    if n not in out:
                        out[n] = torch.empty(shape, dtype=getattr(torch, dtype))
                    out[n][tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))].copy_(t)
        if through_dcp:
            sd: Dict[Any, Any] = {}
            for n in through_dcp:
                shape, dtype = self.arrays[n]
                _put_dcp(sd, self._keys[n], torch.empty(shape, dtype=getattr(torch, dtype)))
            self._load(sd)
            out.update((n, _get(sd, self._keys[n])) for n in through_dcp)
        # The tensors are this reader's own: numpy views of them, not copies.
        return {n: torch_to_numpy(out[n], copy=False) for n in names}


def _put_dcp(tree: Any, keys: Tuple[Any, ...], leaf: Any) -> None:
    """Places ``leaf`` at ``keys`` in nested dicts and lists (an int key in
    DCP's path is a list index)."""
    node = tree
    for k, nxt in zip(keys[:-1], keys[1:]):
        child = node[k] if (isinstance(node, list) and k < len(node) and node[k] is not None) else \
            (node.get(k) if isinstance(node, dict) else None)
        if child is None:
            child = [] if isinstance(nxt, int) else {}
            _set(node, k, child)
        node = child
    _set(node, keys[-1], leaf)


def _set(node: Any, k: Any, v: Any) -> None:
    if isinstance(node, list):
        while len(node) <= k:
            node.append(None)
    node[k] = v


def _get(tree: Any, keys: Tuple[Any, ...]) -> Any:
    for k in keys:
        tree = tree[k]
    return tree


def _torch_dtype_name(name: str, dtype: Any) -> str:
    n = str(dtype).removeprefix("torch.")
    if n not in _leaves.DTYPES:
        raise InvalidArgumentError(f"array '{name}': dtype {dtype} is not supported")
    return n


def torch_to_numpy(t, copy: bool = True) -> np.ndarray:
    """The bytes of a CPU tensor as a numpy array of its dtype (bfloat16 and
    float8 through ml_dtypes); ``copy=False``: a view that keeps the tensor
    alive, for a tensor nobody else holds."""
    import torch

    t = t.detach().contiguous()
    dtype = _leaves.numpy_dtype(_torch_dtype_name("tensor", t.dtype))
    if t.dtype == torch.bool:
        a = t.numpy()
    else:
        a = t.reshape(-1).view(torch.uint8).numpy().view(dtype).reshape(tuple(t.shape))
    return a.copy() if copy else a


def numpy_to_torch(a: np.ndarray):
    import torch

    shape = a.shape  # np.ascontiguousarray makes a 0-d array 1-d
    a = np.ascontiguousarray(a)
    name = _leaves.numpy_dtype_name("array", a.dtype)
    if name == "bool":
        return torch.from_numpy(a.copy()).reshape(shape)
    raw = torch.from_numpy(a.reshape(-1).view(np.uint8).copy())
    return raw.view(getattr(torch, name)).reshape(shape)


# ----------------------------------------------------------- safetensors in


class SafetensorsSource(Source):
    def __init__(self, path: str):
        super().__init__()
        from safetensors import safe_open

        self._safe_open = safe_open
        if os.path.isdir(path):
            index = os.path.join(path, INDEX)
            if os.path.isfile(index):
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
                files = sorted(set(weight_map.values()))
            else:
                files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
                if not files:
                    raise NotFoundError(f"{path}: no {INDEX} and no .safetensors files")
            files = [os.path.join(path, f) for f in files]
        else:
            files = [path]
        self._file: Dict[str, str] = {}
        for fn in files:
            with safe_open(fn, framework="pt") as f:
                meta = f.metadata() or {}
                if VALUES_META in meta:
                    self.values.update(json.loads(meta[VALUES_META]))
                other = {k: v for k, v in meta.items() if k != VALUES_META}
                if other:
                    self.metadata.setdefault("safetensors.metadata", {}).update(other)
                for name in f.keys():
                    if name in self._file:
                        raise InvalidArgumentError(f"tensor '{name}' is in both {self._file[name]} and {fn}")
                    sl = f.get_slice(name)
                    self.arrays[name] = (tuple(sl.get_shape()), _safetensors_dtype(name, sl.get_dtype()))
                    self._file[name] = fn

    def read(self, names: List[str]) -> Dict[str, np.ndarray]:
        out = {}
        by_file: Dict[str, List[str]] = {}
        for n in names:
            by_file.setdefault(self._file[n], []).append(n)
        for fn, ns in by_file.items():
            with self._safe_open(fn, framework="pt") as f:
                for n in ns:
                    out[n] = torch_to_numpy(f.get_tensor(n))
        return out


_SAFETENSORS_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
    "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


def _safetensors_dtype(name: str, code: str) -> str:
    n = _SAFETENSORS_DTYPES.get(code)
    if n is None:
        raise InvalidArgumentError(f"tensor '{name}': safetensors dtype {code} is not supported")
    return n
