"""The benchmark model shared by the peer benchmarks (Orbax, DCP, h5py).

The same arrays, shapes, dtypes and byte counts as mhckpt's own benchmark
(bench/snapshot_bench.cc, BuildModel): a mixed-precision training state of
14 bytes per parameter.

  cols = 4096, rows = max(np, round(S * 2**20 / 14 / 2 / cols))
  8 large arrays [rows, cols], sharded by rows:
      params/embedding, params/mlp          bfloat16
      master/*, adam_m/*, adam_v/*          float32
  66 small arrays that every rank holds whole (replicated):
      norms/000 .. norms/063  float32 [4096]
      step                    int64   []
      rng_state               uint32  [624]

Contents are pseudo-random bytes: PCG64 seeded per array name, read as raw
64-bit words in row-major order. A rank's rows are produced by advancing the
generator to its first byte, so any process can regenerate any box to check
a restore without holding the whole array.

Row layouts: "floor" is mhckpt's (rank r holds rows [rows*r//np,
rows*(r+1)//np)); "ceil" is the chunked layout that jax's NamedSharding and
DTensor's Shard(0) use (ceil(rows/np) rows per rank, the last ones shorter).
Both hold the same global bytes; only which rank holds a boundary row differs.

Works with Debian's numpy 1.24 (h5py peer, no ml_dtypes) and the venv's numpy 2.
"""
import json
import math
import os
import socket
import statistics
import tempfile
import time
import zlib

import numpy as np

COLS = 4096
KINDS = [("params", "bfloat16"), ("master", "float32"), ("adam_m", "float32"), ("adam_v", "float32")]
TENSORS = ["embedding", "mlp"]
LARGE = [(f"{k}/{t}", dt) for k, dt in KINDS for t in TENSORS]
SMALL = [(f"norms/{i:03d}", "float32", (COLS,)) for i in range(64)] + [
    ("step", "int64", ()),
    ("rng_state", "uint32", (624,)),
]
ITEMSIZE = {"bfloat16": 2, "float32": 4, "int64": 8, "uint32": 4}


def nest(flat):
    """{"a/b": x} -> {"a": {"b": x}}: a model's flat names as a pytree."""
    out = {}
    for k, v in flat.items():
        d = out
        *head, last = k.split("/")
        for h in head:
            d = d.setdefault(h, {})
        d[last] = v
    return out


def flatten(tree, prefix=""):
    """The inverse of nest."""
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "/"))
        else:
            out[name] = v
    return out


def numpy_dtype(name):
    """The numpy dtype for a model dtype; bfloat16 is ml_dtypes' where present, else raw uint16."""
    if name == "bfloat16":
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    return np.dtype(name)


def num_rows(mib, np_):
    # floor(x + 0.5): C's llround for positive x (Python's round() rounds halves to even).
    return max(np_, int(math.floor(mib * 2**20 / 14 / 2 / COLS + 0.5)))


def row_range(rows, rank, np_, layout="floor"):
    if layout == "floor":
        return rows * rank // np_, rows * (rank + 1) // np_
    chunk = -(-rows // np_)
    return min(rows, chunk * rank), min(rows, chunk * (rank + 1))


def _seed(name):
    return zlib.crc32(name.encode()) + 0x5EED0000


def random_bytes(name, offset, nbytes):
    """nbytes of the pseudo-random stream of array `name`, from byte `offset` (both multiples of 8)."""
    assert offset % 8 == 0
    g = np.random.PCG64(_seed(name))
    g.advance(offset // 8)
    return g.random_raw((nbytes + 7) // 8).view(np.uint8)[:nbytes]


def large_block(name, dtype, rows, begin, end):
    """Rows [begin, end) of large array `name`, a fresh C-contiguous array."""
    row_bytes = COLS * ITEMSIZE[dtype]
    raw = random_bytes(name, begin * row_bytes, (end - begin) * row_bytes)
    return raw.view(numpy_dtype(dtype)).reshape(end - begin, COLS)


def small_array(name, dtype, shape):
    n = int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dtype]
    return random_bytes(name, 0, max(n, 8))[:n].view(numpy_dtype(dtype)).reshape(shape).copy()


def build_local(mib, np_, rank, layout="floor"):
    """This rank's arrays: {name: ndarray}, large ones as its row block, small ones whole."""
    rows = num_rows(mib, np_)
    out = {}
    for name, dt in LARGE:
        b, e = row_range(rows, rank, np_, layout)
        out[name] = large_block(name, dt, rows, b, e)
    for name, dt, shape in SMALL:
        out[name] = small_array(name, dt, shape)
    return out


def small_bytes():
    return sum(int(np.prod(s, dtype=np.int64)) * ITEMSIZE[dt] for _, dt, s in SMALL)


def global_bytes(mib, np_):
    rows = num_rows(mib, np_)
    large = sum(rows * COLS * ITEMSIZE[dt] for _, dt in LARGE)
    small = sum(int(np.prod(s, dtype=np.int64)) * ITEMSIZE[dt] for _, dt, s in SMALL)
    return large + small


def local_bytes_max(mib, np_, layout="floor"):
    rows = num_rows(mib, np_)
    small = sum(int(np.prod(s, dtype=np.int64)) * ITEMSIZE[dt] for _, dt, s in SMALL)
    best = 0
    for r in range(np_):
        b, e = row_range(rows, r, np_, layout)
        best = max(best, sum((e - b) * COLS * ITEMSIZE[dt] for _, dt in LARGE) + small)
    return best


def same_bytes(a, b):
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    return a.shape == b.shape and a.nbytes == b.nbytes and a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def verify_local(arrays, mib, np_, rank, layout="floor"):
    """True when `arrays` ({name: ndarray-like}) hold exactly this rank's expected bytes."""
    want = build_local(mib, np_, rank, layout)
    if set(arrays) != set(want):
        return False
    return all(same_bytes(np.asarray(arrays[k]), want[k]) for k in want)


# --- memory --------------------------------------------------------------------------------

def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def rss_bytes():
    return _status_kib("VmRSS") * 1024


def hwm_bytes():
    return _status_kib("VmHWM") * 1024


def reset_hwm():
    """Resets VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --- page cache ----------------------------------------------------------------------------

def drop_caches():
    """os.sync(), then drop the page cache. Needs root; raises otherwise."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


# --- records -------------------------------------------------------------------------------

def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def record(system, version, mib, np_, restore_np, reps, samples, peak_rss_extra, fsync, verified,
           launcher, notes, layout="floor"):
    return {
        "system": system,
        "version": version,
        "case": "sharded",
        "np": np_,
        "restore_np": restore_np,
        "mib": int(mib) if float(mib).is_integer() else mib,
        "global_bytes": global_bytes(mib, np_),
        "local_bytes_max": local_bytes_max(mib, np_, layout),
        "reps": reps,
        "stall_s": median(samples.get("stall_s", [])),
        "commit_s": median(samples.get("commit_s", [])),
        "restore_s": median(samples.get("restore_s", [])),
        "reshard_s": median(samples.get("reshard_s", [])) if restore_np else None,
        "peak_rss_extra_bytes": int(peak_rss_extra),
        "fsync": bool(fsync),
        "verified": bool(verified),
        "launcher": launcher,
        "notes": notes,
        "samples": {k: samples.get(k, []) for k in ("stall_s", "commit_s", "restore_s", "reshard_s")},
    }


def append_record(path, rec):
    """Appends rec to the JSON list in path (created if missing)."""
    recs = []
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path) as f:
            recs = json.load(f)
    recs.append(rec)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(recs, f, indent=1)
    os.replace(tmp, path)


def common_args(description):
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--mib", type=lambda v: int(v) if float(v).is_integer() else float(v), required=True, help="global model size, MiB")
    p.add_argument("--np", type=int, required=True, dest="np_", help="processes that save")
    p.add_argument("--dir", required=True, help="checkpoint directory (created; contents deleted)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", required=True, help="JSON list to append the record to")
    p.add_argument("--restore-np", type=int, default=None, help="also restore at this many processes")
    p.add_argument("--drop-caches", action="store_true", help="drop the page cache before each restore (root)")
    # Set by the driver (drive()) for the worker processes it starts.
    p.add_argument("--role", choices=["driver", "save", "reshard"], default="driver")
    p.add_argument("--out-part", default=None)
    return p


def free_port():
    """A TCP port on loopback that is free now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(name, procs, out_part):
    """Waits for the worker processes `procs` (subprocess.Popen) and returns
    the JSON report they left in out_part; exits naming `name` if any failed."""
    rcs = [p.wait() for p in procs]
    if any(rcs):
        raise SystemExit(f"{name}: workers failed: exit codes {rcs}")
    with open(out_part) as f:
        return json.load(f)


now = time.perf_counter


def drive(args, launch, extra_args=()):
    """The driver side every peer shares: one launch of args.np_ workers (role
    "save": saves, then restores at the same world size) and, with
    --restore-np, one launch of args.restore_np workers (role "reshard").
    `launch(n, argv, out_part)` starts n workers and returns the JSON report
    they left in out_part. Returns (the save launch's report, samples, verified)."""
    os.makedirs(args.dir, exist_ok=True)
    base = ["--mib", str(args.mib), "--np", str(args.np_), "--dir", args.dir, "--reps", str(args.reps),
            "--json", args.json] + (["--drop-caches"] if args.drop_caches else []) + list(extra_args)
    with tempfile.TemporaryDirectory() as tmp:
        r = launch(args.np_, base + ["--role", "save"], os.path.join(tmp, "save.json"))
        verified = r["verified_restore_s"]
        samples = {k: r[k] for k in ("stall_s", "commit_s", "restore_s")}
        if args.restore_np:
            q = launch(args.restore_np, base + ["--role", "reshard"], os.path.join(tmp, "reshard.json"))
            samples["reshard_s"] = q["reshard_s"]
            verified = verified and q["verified_reshard_s"]
    return r, samples, verified


def cache_note(args):
    """The sentence every record's notes end with."""
    return (" Page cache dropped before each restore." if args.drop_caches else
            " Page cache NOT dropped: restores may read from memory.")


def finish(args, rec):
    """Appends the record to --json and prints its figures."""
    append_record(args.json, rec)
    print(json.dumps({k: v for k, v in rec.items() if k not in ("notes", "samples")}))
