#!/usr/bin/env python3
"""Combines the records of bench/run.sh into one JSON file, prints the tables of
docs/PERFORMANCE.md (Markdown) with every target marked met or missed, and
draws the plot.

    bench/report.py --out results.json.gz --markdown results.md --plot bench.png RECORDS.json...
    bench/report.py --from results.json.gz         # the tables again, from a combined file

The combined file is compact JSON, gzip'd when its name ends in .gz; --from
reads either form.

A record is one JSON object (see bench/ckpt_bench.cc and bench/peers/): system,
case, np, mib, the medians stall_s, commit_s, restore_s, ... and their samples.
Every ratio below comes from figures of the same run. The JSON and the Markdown
are written before the plot is tried; without matplotlib the plot is skipped
with a message and nothing else is lost.
"""
import argparse
import datetime
import gzip
import json
import os
import platform
import sys

MiB = 1 << 20
PEERS = ("orbax", "dcp", "dcp-cached", "h5py")
PY_SYSTEMS = ("mhckpt-py", "mhckpt-jax")  # mhckpt's Python API (bench/peers/mhckpt_py_bench.py)


def open_text(path, mode="r"):
    """A results file, gzip'd when its name ends in .gz."""
    return gzip.open(path, mode + "t", encoding="utf-8") if path.endswith(".gz") else open(path, mode)


def load_records(paths):
    records = []
    for p in paths:
        with open_text(p) as f:
            doc = json.load(f)
        if isinstance(doc, dict) and "records" in doc:
            doc = doc["records"]
        records.extend(doc if isinstance(doc, list) else [doc])
    for r in records:  # sizes as whole MiB, whoever wrote the record
        if r.get("mib") is not None:
            r["mib"] = int(round(r["mib"]))
    return records


def machine():
    info = {"kernel": platform.release(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except (OSError, StopIteration):
        pass
    return info


def restore_kind(r):
    """'save', 'restore' (same world size as the save) or 'reshard', for mhckpt's sharded records."""
    if r.get("mode") in ("save", "restore", "reshard"):
        mode = r["mode"]
        if mode == "restore" and r.get("saved_np") not in (None, r["np"]):
            return "reshard"
        return mode
    if r.get("stall_s") is not None:
        return "save"
    return "reshard" if r.get("saved_np") not in (None, r["np"]) else "restore"


class Index:
    def __init__(self, records):
        self.raw, self.raw_direct, self.save, self.restore, self.reshard = {}, {}, {}, {}, {}
        self.many, self.repl, self.peer, self.py = {}, {}, {}, {}
        for r in records:
            sysname, case = r.get("system"), r.get("case")
            if sysname == "dd":
                self.raw[r["mib"]] = r
            elif sysname == "dd-direct":
                self.raw_direct[r["mib"]] = r
            elif sysname == "mhckpt" and case == "sharded":
                kind = restore_kind(r)
                if kind == "save":
                    self.save[(r["np"], r["mib"])] = r
                elif kind == "restore":
                    self.restore[(r["np"], r["mib"])] = r
                else:
                    self.reshard[(r["saved_np"], r["np"], r["mib"])] = r
            elif sysname == "mhckpt" and case in ("many_small", "one_array"):
                self.many[(r["np"], case)] = r
            elif sysname == "mhckpt" and case == "replicated":
                self.repl[(r["np"], r["mib"], int(r.get("replica_split_bytes", 0)))] = r
            elif sysname in PEERS:
                self.peer[(sysname, r["np"], r["mib"])] = r
            elif sysname in PY_SYSTEMS:
                self.py[(sysname, r["np"], r["mib"])] = r


def fmt_s(x):
    if x is None:
        return "—"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def spread(r, key):
    """"median (min–max)" of a record's figure, from its samples where it has them."""
    if not r or r.get(key) is None:
        return "—"
    v = (r.get("samples") or {}).get(key) or []
    if len(v) < 2:
        return fmt_s(r[key])
    return f"{fmt_s(r[key])} ({fmt_s(min(v))}–{fmt_s(max(v))})"


def gbps(nbytes, s):
    return f"{nbytes / s / 1e9:.2f} GB/s" if s else "—"


def verdict(ok):
    return "met" if ok else "**missed**"


class Report:
    def __init__(self):
        self.lines, self.targets = [], []

    def p(self, s=""):
        self.lines.append(s)

    def table(self, header, rows):
        if not rows:  # a case this run did not measure: say so instead of an empty table
            self.p("(not measured in this run)")
            self.p()
            return
        if self.lines and self.lines[-1]:
            self.p()
        self.p("| " + " | ".join(header) + " |")
        self.p("|" + "---|" * len(header))
        for row in rows:
            self.p("| " + " | ".join(str(c) for c in row) + " |")
        self.p()

    def target(self, name, where, ratio, limit, ok):
        self.targets.append({"target": name, "where": where, "ratio": round(ratio, 3),
                             "limit": limit, "met": bool(ok)})
        return verdict(ok)


def build(ix, rep):
    # --- stall
    rep.p("**Stall per save** (the time `Save` blocks the training loop; steady state) "
          "against a `memcpy` of the same local bytes into touched memory. Target ≤ 1.1×.")
    rows = []
    for (np_, mib), r in sorted(ix.save.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ratio = r["stall_s"] / r["memcpy_s"] if r.get("memcpy_s") else float("nan")
        v = rep.target("stall <= 1.1x memcpy", f"np={np_} {mib} MiB", ratio, 1.1, ratio <= 1.1)
        rows.append([np_, mib, f"{r['local_bytes_max'] / MiB:.0f}", fmt_s(r["memcpy_s"]),
                     fmt_s(r["stall_s"]), f"**{ratio:.2f}×**", v, fmt_s(r.get("first_stall_s"))])
    rep.table(["np", "MiB", "local MiB", "memcpy", "Save stall", "stall / memcpy", "≤ 1.1×",
               "first Save (staging untouched)"], rows)

    build_targets(ix, rep)

    # --- reshard
    rep.p("**Restore on another world size**: a checkpoint saved at N ranks restored at M, "
          "against restoring at M one that was saved at M. Target ≤ 1.1×.")
    rows = []
    for (n, m, mib), r in sorted(ix.reshard.items(), key=lambda kv: (kv[0][2], kv[0][0])):
        plain = ix.restore.get((m, mib))
        if not plain:
            continue
        ratio = r["restore_s"] / plain["restore_s"]
        v = rep.target("reshard <= 1.1x plain restore", f"{n}->{m} {mib} MiB", ratio, 1.1, ratio <= 1.1)
        rows.append([f"{n} → {m}", mib, fmt_s(plain["restore_s"]), fmt_s(r["restore_s"]),
                     f"**{ratio:.2f}×**", v, "yes" if r.get("verified") else "**no**"])
    rep.table(["N → M", "MiB", "restore at M (saved at M)", "restore at M (saved at N)", "ratio",
               "≤ 1.1×", "bytes equal"], rows)

    # --- many small arrays
    rep.p("**10,000 arrays** (a transformer-like mix) against one array of the same bytes. "
          "Target ≤ 1.5× (commit and restore).")
    rows = []
    for np_ in sorted({k[0] for k in ix.many}):
        many, one = ix.many.get((np_, "many_small")), ix.many.get((np_, "one_array"))
        if not (many and one):
            continue
        row = [np_, f"{many['global_bytes'] / MiB:.0f}", many.get("n_arrays", "—")]
        for key in ("stall_s", "commit_s", "restore_s"):
            ratio = many[key] / one[key] if one.get(key) else float("nan")
            row += [fmt_s(one.get(key)), fmt_s(many.get(key)), f"**{ratio:.2f}×**"]
            if key != "stall_s":
                row.append(rep.target(f"10k arrays {key[:-2]} <= 1.5x one array", f"np={np_}", ratio, 1.5,
                                      ratio <= 1.5))
        rows.append(row)
    rep.table(["np", "MiB", "arrays", "stall one", "stall many", "ratio", "commit one", "commit many", "ratio",
               "≤ 1.5×", "restore one", "restore many", "ratio", "≤ 1.5×"], rows)

    # --- memory
    rep.p("**Extra peak RSS** during saves (VmHWM − VmRSS before, worst rank) against the local "
          "checkpoint bytes. Target ≤ 1.0× local bytes + 64 MiB.")
    rows = []
    for (np_, mib), r in sorted(ix.save.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        extra, local = r.get("peak_rss_extra_bytes"), r["local_bytes_max"]
        if extra is None:
            continue
        ok = extra <= local + 64 * MiB
        v = rep.target("extra RSS <= local + 64 MiB", f"np={np_} {mib} MiB", extra / (local + 64 * MiB), 1.0, ok)
        rows.append([np_, mib, f"{local / MiB:.0f}", f"{extra / MiB:.0f}", f"{extra / local:.2f}×", v])
    rep.table(["np", "MiB", "local MiB", "extra peak MiB", "extra / local", "≤ local + 64 MiB"], rows)

    # --- replicated
    rep.p("**Pure data parallel** (every array on every rank): rank 0 writes everything (the "
          "default) against splitting each large replicated array among its holders "
          "(`Options::replica_parallel_min_bytes`).")
    rows = []
    for (np_, mib, split), r in sorted(ix.repl.items()):
        if split == 0:
            continue
        base = ix.repl.get((np_, mib, 0))
        if not base:
            continue
        rows.append([np_, mib, f"{split / MiB:g}", fmt_s(base["stall_s"]), fmt_s(r["stall_s"]), fmt_s(base["commit_s"]),
                     fmt_s(r["commit_s"]), f"**{base['commit_s'] / r['commit_s']:.2f}×**",
                     fmt_s(base.get("restore_s")), fmt_s(r.get("restore_s"))])
    rep.table(["np", "MiB per rank", "split above MiB", "stall rank 0", "stall split", "commit rank 0", "commit split",
               "speed-up of split", "restore (rank-0 file)", "restore (split file)"], rows)

    # --- peers
    rep.p("**Against the peers**, same model, same machine, same file system. Target: mhckpt's "
          "stall ≤ 0.5× the peer's (ratio = mhckpt / peer). Commit and restore ratios (peer time / "
          "mhckpt time) are shown for reference; their targets are in the side-by-side table above. "
          "h5py is synchronous: its stall is its commit.")
    rows = []
    for (peer, np_, mib), r in sorted(ix.peer.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        ours = ix.save.get((np_, mib))
        ours_r = ix.restore.get((np_, mib))
        if not ours:
            continue
        row = [peer, r.get("version", ""), np_, mib, "yes" if r.get("fsync") else "**no**"]
        st = ours["stall_s"] / r["stall_s"] if r.get("stall_s") else float("nan")
        cm = r["commit_s"] / ours["commit_s"] if r.get("commit_s") else float("nan")
        rs = r["restore_s"] / ours_r["restore_s"] if (ours_r and r.get("restore_s")) else float("nan")
        where = f"{peer} np={np_} {mib} MiB"
        vs = "ref." if peer == "h5py" else rep.target("stall <= 0.5x peer", where, st, 0.5, st <= 0.5)
        row += [spread(r, "stall_s"), f"{st:.2f}×", vs, spread(r, "commit_s"), f"{cm:.2f}×",
                spread(r, "restore_s"), f"{rs:.2f}×", reshard_cell(r, ix),
                "yes" if r.get("verified") else "**no**"]
        rows.append(row)
    rep.table(["peer", "version", "np", "MiB", "fsync", "peer stall (min–max)", "ours / peer", "≤ 0.5×",
               "peer commit (min–max)", "peer / ours", "peer restore (min–max)", "peer / ours",
               "restore at M: peer / ours", "bytes equal"], rows)

    build_python(ix, rep)

    met = sum(t["met"] for t in rep.targets)
    rep.lines.insert(0, f"Targets met: **{met} of {len(rep.targets)}** points.\n")
    missed = sorted({t["target"] for t in rep.targets if not t["met"]})
    if missed:
        rep.lines.insert(1, "Missed somewhere: " + "; ".join(missed) + ".\n")


def build_targets(ix, rep):
    """The targets, side by side: save-to-commit against dd (buffered and
    O_DIRECT), Orbax and DCP; restore against a cold dd read, h5py's naive
    collective read and the peers. Ratios are of throughput (other time /
    mhckpt time for the same bytes: > 1 means mhckpt is faster)."""
    def ratio(other, ours, other_bytes=None, our_bytes=None):
        if not other or not ours:
            return None
        if other_bytes and our_bytes:  # dd writes whole MiB, the model a few KiB more or less
            return (our_bytes / ours) / (other_bytes / other)
        return other / ours

    def cell(x, limit=None, name=None, where=None):
        if x is None:
            return "—"
        if limit is None:
            return f"{x:.2f}×"
        return f"**{x:.2f}×** {rep.target(name, where, x, limit, x >= limit)}"

    rep.p("**Save to commit, side by side**. Commit = `Save` start until `WaitUntilFinished` "
          "returns (data fsync'd, marker committed, and the retention of `max_to_keep = 2`, which "
          "`WaitUntilFinished` also waits for: it retires the old step and frees its files in the "
          "background); *no ret.* = the same without "
          "the retention "
          "(`commit_s − gc_s` per rep). dd writes the same random bytes from tmpfs with `conv=fsync`, "
          "buffered and with `oflag=direct`. Each figure: median (min–max) of the reps. Ratios: other "
          "time / mhckpt time for the same bytes (> 1: mhckpt faster). Targets: ≥ 1.0× buffered dd, "
          "≥ 0.9× direct dd, ≥ 1.5× Orbax and DCP (both stagers).")
    rows = []
    for (np_, mib), r in sorted(ix.save.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        where = f"np={np_} {mib} MiB"
        raw, direct = ix.raw.get(mib), ix.raw_direct.get(mib)
        ours, b = r["commit_s"], r["global_bytes"]
        row = [np_, mib, spread(r, "commit_s"), fmt_s(r.get("commit_no_retention_s")),
               spread(raw, "commit_s"),
               cell(ratio(raw and raw["commit_s"], ours, raw and raw["global_bytes"], b), 1.0,
                    "commit >= 1.0x buffered dd", where),
               spread(direct, "commit_s"),
               cell(ratio(direct and direct["commit_s"], ours, direct and direct["global_bytes"], b), 0.9,
                    "commit >= 0.9x direct dd", where)]
        for peer in ("orbax", "dcp", "dcp-cached"):
            p = ix.peer.get((peer, np_, mib))
            row += [spread(p, "commit_s"),
                    cell(ratio(p and p.get("commit_s"), ours), 1.5, f"commit >= 1.5x faster than {peer}", where)]
        rows.append(row)
    rep.table(["np", "MiB", "mhckpt commit", "no ret.", "dd buffered", "dd / ours ≥ 1.0×", "dd direct",
               "dd direct / ours ≥ 0.9×", "Orbax", "Orbax / ours ≥ 1.5×", "DCP", "DCP / ours ≥ 1.5×",
               "DCP cached", "DCP cached / ours ≥ 1.5×"], rows)

    cold = any(r.get("cold_read") for r in ix.raw.values())
    rep.p("**Restore, side by side**: every system restores into new, untouched arrays after one "
          "untimed restore" + (", page cache dropped before each" if cold else " (page cache NOT dropped)") +
          ". Targets: ≥ 1.0× a cold dd read of the same bytes, and faster than h5py's naive collective read "
          "(> 1.0×); the other peers for reference.")
    rows = []
    for (np_, mib), r in sorted(ix.restore.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        where = f"np={np_} {mib} MiB"
        raw = ix.raw.get(mib)
        ours, b = r["restore_s"], r["global_bytes"]
        row = [np_, mib, spread(r, "restore_s"), spread(raw, "restore_s"),
               cell(ratio(raw and raw.get("restore_s"), ours, raw and raw["global_bytes"], b), 1.0,
                    "restore >= 1.0x cold dd read", where)]
        h = ix.peer.get(("h5py", np_, mib))
        hr = ratio(h and h.get("restore_s"), ours)
        row += [spread(h, "restore_s"),
                "—" if hr is None else f"**{hr:.2f}×** " + rep.target("restore faster than h5py", where, hr, 1.0,
                                                                     hr > 1.0)]
        for peer in ("orbax", "dcp", "dcp-cached"):
            p = ix.peer.get((peer, np_, mib))
            row += [spread(p, "restore_s"), cell(ratio(p and p.get("restore_s"), ours))]
        rows.append(row)
    rep.table(["np", "MiB", "mhckpt restore", "dd read (cold)", "dd / ours ≥ 1.0×", "h5py", "h5py / ours > 1.0×",
               "Orbax", "Orbax / ours", "DCP", "DCP / ours", "DCP cached", "DCP cached / ours"], rows)


def build_python(ix, rep):
    """mhckpt's Python API beside the C++ figures of the same run."""
    if not ix.py:
        return
    rep.p("**From Python**: `import mhckpt` (bench/peers/mhckpt_py_bench.py) on mhckpt-bench's model, "
          "options and sequence, numpy leaves (`mhckpt-py`; `mhckpt-jax`: jax.Array leaves, for reference). "
          "Target: the Python layer's share of the stall — `save()` minus the C++ `Save`'s own time, "
          "measured in the same process — ≤ 5% of the C++ stall. The end-to-end ratios (Python / C++) "
          "compare runs made minutes apart on a noisy disk; `bench/run_python_overhead.py` interleaves "
          "them (docs/PERFORMANCE.md, 'Save, commit and restore').")
    rows = []
    for (sysname, np_, mib), r in sorted(ix.py.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        c, cr = ix.save.get((np_, mib)), ix.restore.get((np_, mib))
        if not c:
            continue

        def ratio(a, b):
            return f"{a / b:.2f}×" if (a is not None and b) else "—"

        layer = r.get("overhead_s")
        share = layer / c["stall_s"] if layer is not None and c.get("stall_s") else float("nan")
        if sysname == "mhckpt-py":
            v = rep.target("Python layer <= 5% of the C++ stall", f"np={np_} {mib} MiB", share, 0.05,
                           share <= 0.05)
        else:
            v = "ref."
        m = r.get("restore_np")
        theirs = ix.reshard.get((np_, m, mib)) if m else None
        resh = (f"{np_} → {m}: {ratio(r.get('reshard_s'), theirs['restore_s'])}"
                if theirs and r.get("reshard_s") else "—")
        rows.append([sysname, np_, mib, fmt_s(c["stall_s"]), fmt_s(r.get("stall_s")), ratio(r.get("stall_s"), c["stall_s"]),
                     fmt_s(layer), f"**{share * 100:.1f}%**", v,
                     fmt_s(c["commit_s"]), fmt_s(r.get("commit_s")), ratio(r.get("commit_s"), c["commit_s"]),
                     fmt_s(cr["restore_s"]) if cr else "—", fmt_s(r.get("restore_s")),
                     ratio(r.get("restore_s"), cr["restore_s"] if cr else None), resh,
                     "yes" if r.get("verified") else "**no**"])
    rep.table(["API", "np", "MiB", "C++ stall", "Python stall", "Py / C++", "Python layer", "of C++ stall",
               "≤ 5%", "C++ commit", "Python commit", "Py / C++", "C++ restore", "Python restore", "Py / C++",
               "restore at M: Py / C++", "bytes equal"], rows)


def reshard_cell(r, ix):
    """The peer's restore at another world size against mhckpt's of the same change."""
    m = r.get("restore_np")
    ours = ix.reshard.get((r["np"], m, r["mib"])) if m else None
    if not (ours and r.get("reshard_s")):
        return "—"
    return (f"{r['np']} → {m}: {fmt_s(r['reshard_s'])} / {fmt_s(ours['restore_s'])} = "
            f"{r['reshard_s'] / ours['restore_s']:.2f}×")


def plot(ix, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nps = sorted({k[0] for k in ix.save})
    fig, axes = plt.subplots(len(nps), 3, figsize=(14, 3.6 * len(nps)), squeeze=False)
    styles = {"mhckpt": "o-", "orbax": "s--", "dcp": "^--", "dcp-cached": "^:", "h5py": "v:", "dd": "k-", "memcpy": "k:"}
    for i, np_ in enumerate(nps):
        ax_stall, ax_commit, ax_restore = axes[i]
        sizes = sorted(m for (n, m) in ix.save if n == np_)
        ours = [ix.save[(np_, m)] for m in sizes]
        ax_stall.plot(sizes, [r["stall_s"] * 1e3 for r in ours], styles["mhckpt"], label="mhckpt")
        ax_stall.plot(sizes, [r.get("memcpy_s", 0) * 1e3 for r in ours], styles["memcpy"], label="memcpy")
        for peer in PEERS:
            pts = [(m, ix.peer[(peer, np_, m)]) for m in sizes if (peer, np_, m) in ix.peer]
            if pts:
                ax_stall.plot([m for m, _ in pts], [r["stall_s"] * 1e3 for _, r in pts], styles.get(peer, "x--"), label=peer)
        ax_stall.set_ylabel(f"np = {np_}\nstall per save (ms, log)")
        ax_stall.set_yscale("log")

        def throughput(ax, key, raw_label):
            raw = [(m, ix.raw[m]) for m in sizes if m in ix.raw]
            if raw:
                ax.plot([m for m, _ in raw], [m * MiB / r[key] / 1e9 for m, r in raw], styles["dd"], label=raw_label)
            src = ix.save if key == "commit_s" else ix.restore
            pts = [(m, src[(np_, m)]) for m in sizes if (np_, m) in src]
            ax.plot([m for m, _ in pts], [r["global_bytes"] / r[key] / 1e9 for _, r in pts], styles["mhckpt"],
                    label="mhckpt")
            for peer in PEERS:
                pts = [(m, ix.peer[(peer, np_, m)]) for m in sizes if (peer, np_, m) in ix.peer]
                pts = [(m, r) for m, r in pts if r.get(key)]
                if pts:
                    ax.plot([m for m, _ in pts], [r["global_bytes"] / r[key] / 1e9 for _, r in pts], styles[peer],
                            label=peer)

        throughput(ax_commit, "commit_s", "dd write + fsync")
        ax_commit.set_ylabel("save to commit (GB/s)")
        throughput(ax_restore, "restore_s", "dd read")
        ax_restore.set_ylabel("restore (GB/s)")
        for ax in axes[i]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [str(s) for s in sizes])
            ax.set_xlabel("checkpoint MiB (all ranks)")
            ax.grid(alpha=0.3)
            if ax is not ax_stall:
                ax.set_ylim(bottom=0)
        if i == 0:
            for ax in axes[i]:
                ax.legend(fontsize=8)
    fig.suptitle("mhckpt against memcpy, dd and its peers (medians; higher is better for GB/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="*")
    ap.add_argument("--from", dest="combined", help="a combined results file written by --out")
    ap.add_argument("--out")
    ap.add_argument("--markdown", help="write the tables to this file too")
    ap.add_argument("--plot")
    ap.add_argument("--note", default="")
    args = ap.parse_args()

    if args.combined:
        with open_text(args.combined) as f:
            doc = json.load(f)
    else:
        doc = {"bench": "run", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "note": args.note, "machine": machine(), "records": load_records(args.records)}
    ix = Index(doc["records"])
    rep = Report()
    build(ix, rep)
    doc["targets"] = rep.targets
    text = f"Results of {doc['date']} ({doc.get('note', '')}; machine: {doc.get('machine')})\n\n" + \
        "\n".join(rep.lines) + "\n"
    # The results first: nothing below may lose them.
    if args.out:
        with open_text(args.out, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"report: matplotlib is not installed: no plot ({args.plot}); the JSON and the tables are written",
                  file=sys.stderr)
        else:
            plot(ix, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
