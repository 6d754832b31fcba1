"""``python -m mhckpt convert SRC DST``: checkpoints of other libraries into
an mhckpt step, and an mhckpt step out to safetensors.

Sources (found by what SRC holds, or ``--from``):
  - orbax: an Orbax step directory (items as subdirectories: ``state/``,
    ``meta/``, ...), one item directory, or an Orbax root (its latest step,
    or ``--step``). Pytree items are read through ``orbax.checkpoint``
    (tensorstore); JSON items through its JsonCheckpointHandler.
  - dcp: a torch.distributed.checkpoint directory (``.metadata``), read
    through DCP's ``FileSystemReader``: its metadata, and each item's slice
    of its file ``torch.load``-ed as the reader does (non-tensor entries and
    items with storage transforms: through DCP's ``load``).
  - safetensors: a ``.safetensors`` file, or a directory of them with
    ``model.safetensors.index.json``, read through the ``safetensors`` library.
  - mhckpt: an mhckpt root (``step_*``), its latest step or ``--step``.

Destinations: an mhckpt root (the step: the Orbax step's number, else
``--step``, else 0), or safetensors (DST ending in ``.safetensors``, or
``--to safetensors``: a directory with ``model.safetensors`` at one process,
``model-0000i-of-0000N.safetensors`` files and ``model.safetensors.index.json``
at N processes).

Names (the rule): a leaf's mhckpt name is its key path joined with ``/``, as
mhckpt's own API names it. Orbax: the item name, then the tree path
(``state/params/w1``; sequence items by index); a lone item directory by its
tree paths alone. DCP: the state dict's key path
as DCP records it (``model/0.weight``, ``optim/state/0.weight/exp_avg``);
non-tensor entries are unpickled and named further by their own path
(``optim/param_groups/0/betas/0``). safetensors: the tensor's name unchanged,
both ways. So ``mhckpt.orbax`` restores a converted Orbax step with the same
``args`` as the original, and ``mhckpt.torch.load`` a converted DCP
checkpoint with the same state dict.

Values: plain values (None, bool, int, float, str) stay values; safetensors
keeps an mhckpt step's values as JSON under its metadata key
``mhckpt.values`` (and reads them back). Other Python objects raise.

It runs under mpirun at any process count: the arrays are dealt to the
processes by size, each reads its own whole and saves (or writes) them, and
mhckpt checksums every byte it writes and checks every byte it reads.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _leaves
from ._errors import InvalidArgumentError, IoError, NotFoundError
from ._manager import CheckpointManager
from ._shard import Shard

_STEP_DIR = re.compile(r"^step_(\d{10})$")
_INDEX = "model.safetensors.index.json"
_VALUES_META = "mhckpt.values"


class Source:
    """What a reader gives: arrays by name (shape, dtype name), values by
    name, mhckpt metadata, and a function reading one array whole."""

    def __init__(self):
        self.arrays: Dict[str, Tuple[Tuple[int, ...], str]] = {}
        self.values: Dict[str, Any] = {}
        self.metadata: Dict[str, Any] = {}
        self.step: Optional[int] = None

    def read(self, names: List[str]) -> Dict[str, np.ndarray]:
        raise NotImplementedError


def deal(arrays: Dict[str, Tuple[Tuple[int, ...], str]], size: int) -> Dict[str, int]:
    """Array name -> the rank that reads it: largest first, to the rank with
    the fewest bytes so far (the same on every rank)."""
    load = [0] * size
    out = {}
    sized = []
    for name, (shape, dtype) in arrays.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * _leaves.numpy_dtype(dtype).itemsize
        sized.append((-nbytes, name))
    for neg, name in sorted(sized):
        r = min(range(size), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += -neg
    return out


def _dtype_name(name: str, dtype: Any) -> str:
    return _leaves.numpy_dtype_name(name, dtype)


def _add_value(src: Source, name: str, v: Any) -> None:
    """A plain value, or a tree of them named further by its path."""
    if isinstance(v, dict):
        for k, x in v.items():
            _add_value(src, f"{name}/{k}", x)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _add_value(src, f"{name}/{i}", x)
    elif _leaves.is_value(v):
        src.values[name] = v
    elif isinstance(v, (np.generic,)) or (hasattr(v, "item") and getattr(v, "shape", None) == ()):
        src.values[name] = v.item()
    else:
        raise InvalidArgumentError(
            f"'{name}': a {type(v).__module__}.{type(v).__qualname__} is neither an array nor a plain value "
            "(None, bool, int, float, str)"
        )


# ---------------------------------------------------------------- orbax in


def _is_orbax_item(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in ("_METADATA", "manifest.ocdbt", "_sharding"))


def _is_orbax_json_item(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "metadata")) and not _is_orbax_item(path)


def _is_orbax_step(path: str) -> bool:
    if os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")):
        return True
    return any(_is_orbax_item(os.path.join(path, d)) for d in _subdirs(path))


def _subdirs(path: str) -> List[str]:
    return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))


class OrbaxSource(Source):
    def __init__(self, path: str, step: Optional[int]):
        super().__init__()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import orbax.checkpoint as ocp

        self._ocp = ocp
        if not _is_orbax_step(path) and not _is_orbax_item(path):  # a root of numbered steps
            steps = sorted(int(d) for d in _subdirs(path)
                           if d.isdigit() and _is_orbax_step(os.path.join(path, d)))
            if not steps:
                raise NotFoundError(f"{path}: no Orbax step, item or root of steps")
            if step is None:
                step = steps[-1]
            elif step not in steps:
                raise NotFoundError(f"{path}: no Orbax step {step} (steps: {steps})")
            path = os.path.join(path, str(step))
        base = os.path.basename(os.path.normpath(path))
        if _is_orbax_item(path):  # one item alone: names are its tree paths, a plain step
            items = {"": path}
        else:
            items = {d: os.path.join(path, d) for d in _subdirs(path)
                     if _is_orbax_item(os.path.join(path, d)) or _is_orbax_json_item(os.path.join(path, d))}
            if not items:
                raise NotFoundError(f"{path}: an Orbax step without items")
            kinds = {d: "tree" if _is_orbax_item(p) else "json" for d, p in items.items()}
            self.metadata = {"orbax.items": kinds, "orbax.single": list(kinds) == ["default"]}
            if base.isdigit():
                self.step = int(base)
        self._where: Dict[str, Tuple[str, Tuple[Any, ...]]] = {}  # name -> (item dir, tree path)
        self._meta_trees: Dict[str, Any] = {}
        json_items = {}
        for item, ipath in items.items():
            if not _is_orbax_item(ipath):
                json_items[item] = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(ipath)
                continue
            self._read_tree_metadata(item, ipath)
        if json_items:
            self.metadata["orbax.json"] = json_items

    def _read_tree_metadata(self, item: str, ipath: str) -> None:
        import jax

        meta = self._ocp.PyTreeCheckpointer().metadata(ipath)
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
        self._meta_trees[ipath] = tree
        flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
        from .orbax import _sequence_paths

        seqs = _sequence_paths(tree, ())
        if seqs:  # mhckpt.orbax gives lists back where the tree had them
            self.metadata.setdefault("orbax.sequences", {})[item] = seqs
        prefix = f"{item}/" if item else ""
        for path, leaf in flat:
            keys = tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
            name = prefix + "/".join(str(k) for k in keys) if keys else prefix.rstrip("/") or "value"
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                raise InvalidArgumentError(f"'{name}': Orbax metadata {leaf!r} is not an array's")
            self.arrays[name] = (tuple(int(s) for s in leaf.shape), _dtype_name(name, leaf.dtype))
            self._where[name] = (ipath, keys)

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
            for fqn, keys, name in byte_keys:
                _add_value(self, name, _get(sd, keys))

    def _load(self, sd: Dict[Any, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        dcp.load(sd, storage_reader=FileSystemReader(self._path), no_dist=True)

    def read(self, names: List[str]) -> Dict[str, np.ndarray]:
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
        return {n: _torch_to_numpy(out[n], copy=False) for n in names}


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


def _torch_to_numpy(t, copy: bool = True) -> np.ndarray:
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


def _numpy_to_torch(a: np.ndarray):
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
            index = os.path.join(path, _INDEX)
            if os.path.isfile(index):
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
                files = sorted(set(weight_map.values()))
            else:
                files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
                if not files:
                    raise NotFoundError(f"{path}: no {_INDEX} and no .safetensors files")
            files = [os.path.join(path, f) for f in files]
        else:
            files = [path]
        self._file: Dict[str, str] = {}
        for fn in files:
            with safe_open(fn, framework="pt") as f:
                meta = f.metadata() or {}
                if _VALUES_META in meta:
                    self.values.update(json.loads(meta[_VALUES_META]))
                other = {k: v for k, v in meta.items() if k != _VALUES_META}
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
                    out[n] = _torch_to_numpy(f.get_tensor(n))
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


# --------------------------------------------------------------- mhckpt in


def _mhckpt_step(mgr: CheckpointManager, step: Optional[int]) -> int:
    if step is None:
        step = mgr.latest_step()
        if step is None:
            raise NotFoundError(f"{mgr.root}: no committed step")
    return int(step)


def _is_mhckpt_root(path: str) -> bool:
    return os.path.isdir(path) and any(_STEP_DIR.match(d) for d in os.listdir(path))


# --------------------------------------------------------------- the writes


def to_mhckpt(src: Source, dst: str, step: int, comm) -> int:
    """Saves ``src`` as step ``step`` of the mhckpt root ``dst``; returns the
    bytes this rank read."""
    owner = deal(src.arrays, comm.size)
    mine = [n for n, r in owner.items() if r == comm.rank]
    # The manager first, with the bytes this rank will save: its staging
    # memory is touched in the background while the source is read, so the
    # save copies into touched memory.
    mine_bytes = sum(int(np.prod(src.arrays[n][0], dtype=np.int64)) *
                     _leaves.numpy_dtype(src.arrays[n][1]).itemsize for n in mine)
    with CheckpointManager(dst, comm, reserve=mine_bytes) as mgr:
        return _read_and_save(src, mgr, owner, mine, step, comm)


def _read_and_save(src: Source, mgr: CheckpointManager, owner: Dict[str, int], mine: List[str],
                   step: int, comm) -> int:
    err: Optional[BaseException] = None
    data: Dict[str, np.ndarray] = {}
    try:
        data = src.read(mine)
    except Exception as e:  # agreed below: every rank raises
        err = e
    errors = comm.allgather(None if err is None else f"rank {comm.rank}: {type(err).__name__}: {err}")
    if any(errors):
        raise InvalidArgumentError("convert: reading the source failed: " + "; ".join(e for e in errors if e))
    # 0-d arrays have no empty block: their reader sends them to every rank.
    scalars = {n: data.get(n) for n, (shape, _) in src.arrays.items() if shape == ()}
    for n in scalars:
        scalars[n] = comm.bcast(data.get(n), root=owner[n])
    state: Dict[str, Any] = {}
    for n, (shape, dtype) in src.arrays.items():
        if shape == ():
            state[n] = np.asarray(scalars[n])
            continue
        a = data.get(n)
        if a is None:
            a = np.empty((0,) + tuple(shape[1:]), _leaves.numpy_dtype(dtype))
        elif tuple(a.shape) != tuple(shape) or _dtype_name(n, a.dtype) != dtype:
            raise InvalidArgumentError(
                f"array '{n}': read {a.dtype}{a.shape}, the metadata says {dtype}{shape}")
        state[n] = Shard(a, (0,) * len(shape), shape)
    state.update(src.values)
    mgr.save(step, state, metadata=src.metadata)
    return sum(a.nbytes for a in data.values())


def to_safetensors(root: str, step: Optional[int], dst: str, comm) -> Tuple[int, List[str]]:
    """Writes step ``step`` (None: the latest) of the mhckpt root ``root`` as
    safetensors at ``dst``; returns (this rank's bytes, the files written).

    Collective. Each rank's own work (reading the catalogue, building its
    targets, making ``dst``, writing its file, rank 0's index) is agreed
    through the manager before the next collective step: an error on any
    rank is raised, the same, on every rank, and no rank waits for one that
    failed."""
    with CheckpointManager(root, comm, own_root=False) as mgr:
        err: Optional[BaseException] = None
        target: Dict[str, Any] = {}
        arrays: Dict[str, Tuple[Tuple[int, ...], str]] = {}
        owner: Dict[str, int] = {}
        desc: Dict[str, Any] = {}
        try:
            from safetensors.torch import save_file

            if dst.endswith(".safetensors") and comm.size != 1:
                raise InvalidArgumentError(
                    f"{dst}: one .safetensors file is written by one process; give a directory")
            step = _mhckpt_step(mgr, step)
            desc = mgr.describe(step)
            arrays = {n: (tuple(a["shape"]), a["dtype"]) for n, a in desc["arrays"].items()}
            owner = deal(arrays, comm.size)
            for n, (shape, dtype) in arrays.items():
                dt = _leaves.numpy_dtype(dtype)
                if shape == ():
                    target[n] = np.empty((), dt)
                elif owner[n] == comm.rank:
                    target[n] = Shard(_leaves.new_array(shape, dt), (0,) * len(shape), shape)
                else:
                    target[n] = Shard(np.empty((0,) + shape[1:], dt), (0,) * len(shape), shape)
        except Exception as e:  # agreed next: every rank raises
            err = e
        mgr._agree(err)
        got = mgr.restore(step, target, strict=True)
        mine = {n: (got[n].local if isinstance(got[n], Shard) else got[n])
                for n in arrays if owner[n] == comm.rank}
        meta = {_VALUES_META: json.dumps(desc["values"], sort_keys=True)} if desc["values"] else {}
        if dst.endswith(".safetensors"):
            files = [dst]
        elif comm.size == 1:
            files = [os.path.join(dst, "model.safetensors")]
        else:
            files = [os.path.join(dst, f"model-{r + 1:05d}-of-{comm.size:05d}.safetensors")
                     for r in range(comm.size)]
        if not dst.endswith(".safetensors"):
            try:
                if comm.rank == 0:
                    os.makedirs(dst, exist_ok=True)
            except Exception as e:
                err = e
            mgr._agree(err)  # also: the directory exists before any rank writes into it
        try:
            tensors = {n: _numpy_to_torch(a) for n, a in mine.items()}
            try:
                save_file(tensors, files[comm.rank], metadata=meta or None)
            except Exception as e:  # safetensors' own error type: an I/O error here
                raise IoError(f"{files[comm.rank]}: {e}") from e
            if comm.size > 1 and comm.rank == 0:
                total = sum(int(np.prod(s, dtype=np.int64)) * _leaves.numpy_dtype(d).itemsize
                            for s, d in arrays.values())
                index = {"metadata": {"total_size": total},
                         "weight_map": {n: os.path.basename(files[owner[n]]) for n in sorted(arrays)}}
                with open(os.path.join(dst, _INDEX), "w") as f:
                    json.dump(index, f, indent=2)
        except Exception as e:
            err = e
        mgr._agree(err)  # every file is written before any rank returns
    return sum(a.nbytes for a in mine.values()), files


# --------------------------------------------------------------------- CLI


def detect(src: str) -> str:
    if os.path.isfile(src) and src.endswith(".safetensors"):
        return "safetensors"
    if not os.path.isdir(src):
        raise NotFoundError(f"{src}: no such file or directory")
    if os.path.isfile(os.path.join(src, ".metadata")):
        return "dcp"
    if os.path.isfile(os.path.join(src, _INDEX)) or any(f.endswith(".safetensors") for f in os.listdir(src)):
        return "safetensors"
    if _is_mhckpt_root(src):
        return "mhckpt"
    if _is_orbax_step(src) or _is_orbax_item(src) or any(
            d.isdigit() and _is_orbax_step(os.path.join(src, d)) for d in _subdirs(src)):
        return "orbax"
    raise InvalidArgumentError(f"{src}: not an Orbax, DCP, safetensors or mhckpt checkpoint (give --from)")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mhckpt convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--from", dest="src_format", choices=("orbax", "dcp", "safetensors", "mhckpt"),
                   help="the source's format (default: found from what SRC holds)")
    p.add_argument("--to", dest="dst_format", choices=("mhckpt", "safetensors"),
                   help="default: safetensors if DST ends in .safetensors or SRC is mhckpt, else mhckpt")
    p.add_argument("--step", type=int, help="the step to write (into mhckpt) or to read (from mhckpt, Orbax)")
    a = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    src_format = a.src_format or detect(a.src)
    dst_format = a.dst_format or ("safetensors" if a.dst.endswith(".safetensors") or src_format == "mhckpt"
                                  else "mhckpt")
    if dst_format == "safetensors":
        if src_format != "mhckpt":
            raise InvalidArgumentError(
                "safetensors are written from an mhckpt step: convert into mhckpt first")
        nbytes, files = to_safetensors(a.src, a.step, a.dst, comm)
        total = comm.allreduce(nbytes)
        if comm.rank == 0:
            print(f"convert: {a.src} -> {len(files)} safetensors file(s) in {a.dst}: {total} bytes",
                  flush=True)
        return 0
    if src_format == "orbax":
        src: Source = OrbaxSource(a.src, a.step)
    elif src_format == "dcp":
        src = DcpSource(a.src)
    elif src_format == "safetensors":
        src = SafetensorsSource(a.src)
    else:
        raise InvalidArgumentError("mhckpt to mhckpt: nothing to convert")
    step = src.step if src.step is not None and a.step is None else (a.step or 0)
    nbytes = to_mhckpt(src, a.dst, step, comm)
    total = comm.allreduce(nbytes)
    if comm.rank == 0:
        print(f"convert: {a.src} ({src_format}) -> {a.dst} step {step}: {len(src.arrays)} arrays, "
              f"{len(src.values)} values, {total} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
