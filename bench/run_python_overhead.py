#!/usr/bin/env python3
"""What the Python API costs on top of the C++ API, measured interleaved.

mhckpt-bench (C++) and bench/peers/mhckpt_py_bench.py (`import mhckpt`, numpy
leaves; the same model, options, warm-up and memory state) run one after the
other in one loop, alternating which goes first, for several rounds; every
launch does a warm-up save and then --reps timed saves, and the restores of
both read the same checkpoint (the C++ one: the bytes are the same model),
page cache dropped before each rep when root. Medians over all the samples of
a system, and the per-round ratios Python / C++ beside them, because the disk
here is noisy and other work shares the cores (docs/PERFORMANCE.md, "Save,
commit and restore").

    bench/run_python_overhead.py                       # np 1 2 x 256 1024 MiB, 4 rounds x 3 reps
    bench/run_python_overhead.py --nps 1 --sizes 256 --rounds 2 --reps 2 --out /tmp/x.json
    bench/run_python_overhead.py --from bench/results/python-overhead-DATE.json   # the table again

Needs the C++ benchmark built (default: build-bench-release/bin/mhckpt-bench,
a Release build like the `pip install .` extension's; else build/bin) and the
venv with mhckpt installed (python/setup_venv.sh). --jax adds a third system
per round: the same model as jax.Array leaves (mhckpt_py_bench.py --leaves jax).
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MPI_FLAGS = ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
             "--mca", "btl_vader_single_copy_mechanism", "none"]
SYSTEMS = {"cpp": "mhckpt", "py": "mhckpt-py", "jax": "mhckpt-jax"}


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def commit_tag():
    try:
        c = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
        dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--", "base", "worker", "io", "coordinator",
                    "bench", "python/mhckpt", "python/src", "python/CMakeLists.txt", "pyproject.toml",
                    "CMakeLists.txt"])
        return c + ("+dirty" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def build_type(build_dir):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def rel(path):
    """`path` relative to the repository when it lies inside it."""
    path = os.path.abspath(path)
    return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def can_drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


class Runner:
    def __init__(self, args, tag):
        self.args, self.tag = args, tag
        self.records = []
        self.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
        if args.pythonpath:
            self.env["PYTHONPATH"] = os.pathsep.join(
                [os.path.abspath(args.pythonpath)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        self.py_bench = os.path.join(HERE, "peers", "mhckpt_py_bench.py")

    def launch(self, system, mode, np_, mib, ckpt_dir, meta):
        a = self.args
        out = os.path.join(a.dir, f"part-{len(self.records)}.json")
        if system == "cpp":
            cmd = ["mpirun", "-np", str(np_)] + MPI_FLAGS + [a.cpp, "--mode", mode, "--reps", str(a.reps),
                                                              "--dir", ckpt_dir, "--version-tag", self.tag]
        else:
            cmd = ["mpirun", "-np", str(np_)] + MPI_FLAGS + [a.python, self.py_bench, "--mode", mode,
                                                              "--reps", str(a.reps), "--dir", ckpt_dir,
                                                              "--version-tag", self.tag]
            if system == "jax":
                from socket import socket
                with socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                cmd += ["--leaves", "jax", "--port", str(port)]
        if mode == "save":
            cmd += ["--mib", str(mib), "--keep"]
        elif a.drop_caches:
            cmd += ["--drop-caches"]
        cmd += ["--json", out]
        load = loadavg()
        t0 = time.time()
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=a.timeout)
        if p.returncode != 0 or not os.path.exists(out):
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
            raise SystemExit(f"run_python_overhead: failed ({p.returncode}): {' '.join(cmd)}")
        with open(out) as f:
            rec = json.load(f)[0]
        os.remove(out)
        rec.update(meta)
        rec.update({"bench_system": system, "bench_mode": mode, "loadavg_before": load,
                    "wall_s": round(time.time() - t0, 2), "command": " ".join(cmd)})
        self.records.append(rec)
        fig = rec.get("stall_s") if mode == "save" else rec.get("restore_s")
        print(f"  {system:3} {mode:7} np={np_} {mib:>5} MiB  "
              + (f"stall {rec['stall_s'] * 1e3:7.1f} ms  commit {rec['commit_s']:.3f} s" if mode == "save"
                 else f"restore {fig:.3f} s")
              + f"  verified {rec['verified']}  (load {load}, {rec['wall_s']} s)", flush=True)
        return rec

    def run(self):
        a = self.args
        systems = ["cpp", "py"] + (["jax"] if a.jax else [])
        i = 0
        for rnd in range(a.rounds):
            for mib in a.sizes:
                for np_ in a.nps:
                    # Alternate who goes first, so that neither always follows the other's writes.
                    order = systems if (rnd + i) % 2 == 0 else [systems[1], systems[0]] + systems[2:]
                    i += 1
                    print(f"round {rnd}: np={np_} {mib} MiB, order {order}", flush=True)
                    dirs = {s: os.path.join(a.dir, f"{s}-{np_}-{mib}") for s in systems}
                    for s in order:
                        shutil.rmtree(dirs[s], ignore_errors=True)
                        os.makedirs(dirs[s])
                        self.launch(s, "save", np_, mib, dirs[s], {"round": rnd, "order": order})
                    for s in order:
                        # Both read the C++ checkpoint (the same bytes); jax reads its own (padded rows).
                        src = dirs["jax"] if s == "jax" else dirs["cpp"]
                        ckpt = os.path.join(src, "mhckpt-bench-sharded")
                        self.launch(s, "restore", np_, mib, ckpt, {"round": rnd, "order": order})
                    for d in dirs.values():
                        shutil.rmtree(d, ignore_errors=True)


def summarize(doc):
    """Per (np, mib): medians of every system's samples and the ratios to C++."""
    recs = doc["records"]
    keys = sorted({(r["np"], int(round(r["mib"]))) for r in recs if r["bench_mode"] == "save"},
                  key=lambda k: (k[1], k[0]))
    rows = []
    for np_, mib in keys:
        def pick(system, mode):
            return [r for r in recs if r["bench_system"] == system and r["bench_mode"] == mode
                    and r["np"] == np_ and int(round(r["mib"])) == mib]

        def samples(system, mode, key):
            out = []
            for r in pick(system, mode):
                out += r["samples"].get(key, [])
            return out

        def per_round(system, mode, key):
            return {r["round"]: median(r["samples"].get(key, [])) for r in pick(system, mode)}

        row = {"np": np_, "mib": mib}
        for s in ("cpp", "py", "jax"):
            if not pick(s, "save"):
                continue
            d = {}
            for key in ("stall_s", "commit_s", "memcpy_s", "overhead_s"):
                d[key] = median(samples(s, "save", key))
                d["n_" + key] = len(samples(s, "save", key))
            d["restore_s"] = median(samples(s, "restore", "restore_s"))
            d["n_restore_s"] = len(samples(s, "restore", "restore_s"))
            d["first_stall_s"] = median([r.get("first_stall_s") for r in pick(s, "save")])
            d["snapshot_s"] = median([r["phases"]["snapshot_s"] for r in pick(s, "save")])
            d["stall_per_memcpy"] = median([st / mc for r in pick(s, "save")
                                            for st, mc in zip(r["samples"]["stall_s"], r["samples"]["memcpy_s"])])
            d["verified"] = all(r["verified"] for r in pick(s, "save") + pick(s, "restore"))
            row[s] = d
        for s in ("py", "jax"):
            if s not in row or "cpp" not in row:
                continue
            ratios = {}
            for key, mode in (("stall_s", "save"), ("commit_s", "save"), ("restore_s", "restore")):
                mine, theirs = per_round(s, mode, key), per_round("cpp", mode, key)
                paired = [mine[k] / theirs[k] for k in sorted(mine) if k in theirs and theirs[k]]
                ratios[key] = {"of_medians": row[s][key] / row["cpp"][key] if row["cpp"][key] else None,
                               "per_round": paired, "median_per_round": median(paired)}
            row[s]["ratio_to_cpp"] = ratios
        rows.append(row)
    return rows


def ms(x):
    if x is None:
        return "—"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def table(doc):
    rows = doc["summary"]
    lines = ["| np | MiB | | stall | stall / memcpy | Python layer in the stall | commit | restore |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "cpp" not in row:
            continue
        c = row["cpp"]
        lines.append(f"| {row['np']} | {row['mib']} | C++ | {ms(c['stall_s'])} | {c['stall_per_memcpy']:.2f}× | — | "
                     f"{ms(c['commit_s'])} | {ms(c['restore_s'])} |")
        for s, label in (("py", "Python (numpy)"), ("jax", "Python (jax)")):
            if "ratio_to_cpp" not in row.get(s, {}):
                continue
            p, rt = row[s], row[s]["ratio_to_cpp"]

            def cell(key):
                r = rt[key]
                pr = r["per_round"]
                spread = f"; rounds {min(pr):.2f}–{max(pr):.2f}" if pr else ""
                return f"{ms(p[key])} (**{r['of_medians']:.3f}×**{spread})"

            lines.append(f"| {row['np']} | {row['mib']} | {label} | {cell('stall_s')} | "
                         f"{p['stall_per_memcpy']:.2f}× | {ms(p['overhead_s'])} | {cell('commit_s')} | "
                         f"{cell('restore_s')} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nps", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024], help="MiB, all ranks together")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3, help="timed saves (and restores) per launch")
    ap.add_argument("--jax", action="store_true", help="also the jax.Array leaves variant")
    ap.add_argument("--dir", default="/var/tmp/mhckpt-pyover", help="checkpoints (a disk, not tmpfs)")
    ap.add_argument("--cpp-build", default=None, help="build dir of mhckpt-bench (default: "
                    "build-bench-release if built, else build)")
    ap.add_argument("--python", default=os.path.join(REPO, "python", ".venv", "bin", "python"))
    ap.add_argument("--pythonpath", default=None, help="prepended to PYTHONPATH of the Python jobs: an "
                    "mhckpt installed elsewhere (pip install --target DIR .), e.g. built from one commit")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--version-tag", default=None, help="the commit the library was built from (default: "
                    "this tree's, +dirty with uncommitted changes)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from", dest="combined", help="print the table of a results file again")
    args = ap.parse_args()

    if args.combined:
        with open(args.combined) as f:
            doc = json.load(f)
        print(table(doc))
        return 0
    if args.cpp_build is None:
        release = os.path.join(REPO, "build-bench-release")
        args.cpp_build = (release if os.path.exists(os.path.join(release, "bin", "mhckpt-bench"))
                          else os.path.join(REPO, "build"))
    args.cpp = os.path.join(args.cpp_build, "bin", "mhckpt-bench")
    if not os.access(args.cpp, os.X_OK):
        raise SystemExit(f"run_python_overhead: {args.cpp} not built")
    args.drop_caches = can_drop_caches()
    os.makedirs(args.dir, exist_ok=True)
    tag = args.version_tag or commit_tag()
    started = datetime.datetime.now(datetime.timezone.utc)
    # Where `pip install .` built the extension: next to the --pythonpath install, or this tree's.
    src = os.path.dirname(os.path.abspath(args.pythonpath)) if args.pythonpath else REPO
    py_cache = glob.glob(os.path.join(src, "build-python", "*", "CMakeCache.txt"))
    doc = {"bench": "python-overhead", "date": started.isoformat(timespec="seconds"), "commit": tag,
           "command": " ".join([rel(sys.argv[0])] + sys.argv[1:]),
           "cpp_bench": rel(args.cpp), "cpp_build_type": build_type(args.cpp_build),
           "python_build_type": build_type(os.path.dirname(py_cache[0])) if py_cache else "unknown",
           "python": args.python, "pythonpath": args.pythonpath, "nps": args.nps, "sizes": args.sizes, "rounds": args.rounds,
           "reps": args.reps, "drop_caches": args.drop_caches, "loadavg_start": loadavg(),
           "cores": os.cpu_count()}
    print(f"run_python_overhead: {doc['cpp_bench']} ({doc['cpp_build_type']}) against {args.python} "
          f"(extension {doc['python_build_type']}), commit {tag}, cold restores: {args.drop_caches}", flush=True)
    r = Runner(args, tag)
    try:
        r.run()
    finally:
        doc["records"] = r.records
        doc["loadavg_end"] = loadavg()
        doc["wall_s"] = round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds())
        doc["summary"] = summarize(doc) if r.records else []
        out = args.out or os.path.join(REPO, "bench", "results", f"python-overhead-{started:%Y-%m-%d}.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"run_python_overhead: {len(r.records)} records in {out} ({doc['wall_s']} s)")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
