#!/usr/bin/env python3
"""Turns bench/results/snapshot-*.json (from bench/run_snapshot.sh) into the
Markdown tables of docs/PERFORMANCE.md.

    python3 bench/summarize.py bench/results/snapshot-2024-05-01.json

Standard library only. Every figure is the slowest rank's median (see
bench/snapshot_bench.cc)."""

import json
import sys

MIB = 1024.0 * 1024.0


def ms(s):
    return "n/a" if s is None else f"{s * 1e3:.1f}"


def mib(b):
    return f"{b / MIB:.1f}"


def met(ok):
    return "met" if ok else "**missed**"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main(path):
    with open(path) as f:
        doc = json.load(f)
    runs = doc["runs"]
    key = lambda r: (r["config"]["mib"], r["config"]["np"])
    runs = sorted(runs, key=key)

    print(f"Results: `{path}` ({doc.get('date', '?')}, {doc.get('note', '')})\n")
    m = runs[0]["machine"]
    print(f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_total_bytes'] / 2**30:.1f} GiB, "
          f"{m['kernel']}, THP `{m['transparent_hugepages']}`\n")

    print("**Stall per save** (steady state: staging touched, previous save committed; "
          "median over saves of the slowest rank)\n")
    rows = []
    for r in runs:
        c, s, mc = r["config"], r["stall"], r["memcpy"]
        local = c["local_bytes_max"]
        rows.append([c["np"], f"{c['global_bytes'] / MIB:.0f}", mib(local),
                     f"{ms(mc['median_s'])} ({mc['gibps']:.1f} GiB/s)",
                     ms(mc.get("huge_pages_median_s")),
                     f"{ms(s['steady_median_s'])} ({s['steady_gibps']:.1f} GiB/s)",
                     f"**{s['steady_ratio']:.2f}x**", met(s["met"]),
                     f"{ms(mc.get('cpu_median_s'))} / {ms(s.get('steady_cpu_median_s'))}",
                     ms(s.get("steady_outside_snapshot_median_s")),
                     f"{ms(s['first_s'])} ({s['first_ratio']:.1f}x)",
                     f"{s['first_minor_faults']:.0f} / {s['steady_minor_faults_median']:.0f}",
                     f"{r['machine']['loadavg_before'].split()[0]}"])
    print(table(["np", "global MiB", "local MiB/rank", "memcpy ms", "memcpy, huge pages ms",
                 "Save ms", "Save / memcpy", "<= 1.1x", "CPU ms memcpy / Save", "Save outside the copy ms",
                 "first Save ms (x memcpy)", "page faults first / steady", "load"], rows))

    print("\n**Extra peak RSS** (VmHWM during the first save, a warm-up save and "
          "back-to-back bursts, minus VmRSS before; worst rank)\n")
    rows = []
    for r in runs:
        c, x, big = r["config"], r["rss"], r["bursts"]["large_rss"]
        rows.append([c["np"], f"{c['global_bytes'] / MIB:.0f}", mib(x["local_bytes"]),
                     mib(x["extra_bytes"]), f"{x['ratio']:.2f}x", mib(x["limit_bytes"]),
                     met(x["met"]),
                     f"{mib(big['extra_bytes'])} ({big['ratio']:.2f}x)"])
    print(table(["np", "global MiB", "local MiB", "extra peak RSS MiB", "x local",
                 "limit MiB (local + 64)", "target",
                 f"with budget {runs[0]['config']['budget_copies']} copies: MiB (x local)"],
                rows))

    print("\n**Phases** (median, slowest rank; `plan` cached when the arrays and boxes are "
          "those of the previous save)\n")
    rows = []
    for r in runs:
        c, p, u = r["config"], r["phases"]["cached"], r["phases"]["uncached"]
        rows.append([c["np"], f"{c['global_bytes'] / MIB:.0f}", ms(p["snapshot_s"]),
                     ms(p["plan_s"]), ms(u["plan_s"]), ms(p["write_s"]), ms(p["flush_s"]),
                     ms(p["commit_s"]), ms(p["gc_s"])])
    print(table(["np", "global MiB", "snapshot ms", "plan cached ms", "plan not cached ms",
                 "write ms", "flush ms", "commit ms", "gc ms"], rows))

    print("\n**Back-to-back saves** (k saves without waiting; stall and budget_wait per save, "
          "in ms; total: first Save to all committed)\n")
    rows = []
    for r in runs:
        c = r["config"]
        for name in ("default", "large"):
            b = r["bursts"][name]
            rows.append([c["np"], f"{c['global_bytes'] / MIB:.0f}",
                         f"{b['budget_copies']} ({mib(b['budget_bytes'])} MiB)",
                         " / ".join(ms(x) for x in b["stall_s"]),
                         " / ".join(ms(x) for x in b["budget_wait_s"]),
                         ms(b["total_s"]), f"{b['staging_copies']:.2f}"])
    print(table(["np", "global MiB", "budget copies", "stall per save", "budget_wait per save",
                 "total ms", "staging (copies)"], rows))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
