"""The demo's fingerprint (demo/fingerprint.h) of a committed step, computed
from its data.h5 and commit.json alone, with numpy and h5py: a check that does
not trust mhckpt. Used by tests/demo_test.py and slurm/stress.py."""
import json
import os

import h5py
import numpy as np

MASK = (1 << 64) - 1


def splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK
    return h


def file_fingerprint(step_dir):
    """The fingerprint of step_dir (a step_NNNNNNNNNN directory) as 16 hex digits."""
    with open(os.path.join(step_dir, "commit.json")) as f:
        marker = json.load(f)
    total = 0
    with np.errstate(over="ignore"), h5py.File(os.path.join(step_dir, "data.h5"), "r") as f:
        for a in marker["arrays"]:
            data = np.ascontiguousarray(f[a["name"]][()]).reshape(-1)
            size = data.dtype.itemsize
            raw = np.zeros((data.size, 8), np.uint8)
            raw[:, :size] = data.view(np.uint8).reshape(-1, size)
            values = raw.view("<u8").reshape(-1)
            index = np.arange(data.size, dtype=np.uint64)
            terms = splitmix64(np.uint64(fnv1a64(a["name"])) + splitmix64(index + splitmix64(values)))
            total = (total + int(terms.sum(dtype=np.uint64))) & MASK
    return "%016x" % total
