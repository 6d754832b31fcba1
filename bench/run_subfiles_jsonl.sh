#!/usr/bin/env bash
# bench/run_subfiles.sh (one data.h5 against a subfile per node, 4 Slurm nodes
# x NPN ranks, interleaved rounds), with its per-run JSON records gathered into
# JSON lines: one line per run (case, files, round: its commit_s median and
# samples) and one summary line per case (medians over every save of every
# round, and the single/subfiles ratio: above 1, subfiles commit faster).
#
#   bench/run_subfiles_jsonl.sh [MIB=1024] [ROUNDS=3] [REPS=5] [OUT]
#
# OUT defaults to bench/results/subfiles-DATE-HASH.jsonl; the Markdown table of
# bench/run_subfiles.sh goes beside it (.txt). Environment as for
# bench/run_subfiles.sh (BUILD, NPN, WORK, MHCKPT_SLURM_BASE, MHCKPT_SLURM_PORT,
# KEEP_CLUSTER); WORK defaults to /var/tmp/mhckpt-subfiles-jsonl here so that it
# does not share a work directory with a plain bench/run_subfiles.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-1024}
ROUNDS=${2:-3}
REPS=${3:-5}
rev=$(git rev-parse --short HEAD)
OUT=${4:-bench/results/subfiles-$(date -u +%F)-$rev.jsonl}
export WORK=${WORK:-/var/tmp/mhckpt-subfiles-jsonl}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
bench/run_subfiles.sh "$MIB" "$ROUNDS" "$REPS" "${OUT%.jsonl}.txt"
dirty=$(git status --porcelain --untracked-files=no | wc -l)
/usr/bin/python3 - "$WORK/json" "$OUT" "$MIB" "$ROUNDS" "$REPS" "${NPN:-2}" "$rev" "$dirty" "$load_before" <<'PY'
import glob, json, os, re, statistics, sys
jdir, out, mib, rounds, reps, npn, rev, dirty, load_before = sys.argv[1:]
lines, samples = [], {}
for path in sorted(glob.glob(os.path.join(jdir, "*.json"))):
    m = re.match(r"(save|many)-(-?\d+)-(\d+)\.json$", os.path.basename(path))
    mode, files, rnd = m.group(1), int(m.group(2)), int(m.group(3))
    for r in json.load(open(path)):
        s = r["samples"]["commit_s"]
        samples.setdefault((r["case"], files), []).extend(s)
        lines.append({"kind": "run", "case": r["case"], "ranks_per_file": files, "round": rnd,
                      "np": r["np"], "mib": r["mib"], "reps": r["reps"],
                      "commit_s": r["commit_s"], "commit_no_retention_s": r["commit_no_retention_s"],
                      "samples_commit_s": s, "phases": r.get("phases"), "loadavg": r.get("loadavg"),
                      "date": r.get("date"), "version": r.get("version")})
lines.sort(key=lambda l: (l["case"], l["round"], l["ranks_per_file"]))
for case in sorted({c for c, _ in samples}):
    one, sub = samples.get((case, 0)), samples.get((case, -1))
    if not one or not sub:
        continue
    mo, ms = statistics.median(one), statistics.median(sub)
    lines.append({"kind": "summary", "case": case, "nodes": 4, "ranks_per_node": int(npn),
                  "np": 4 * int(npn), "mib": float(mib), "rounds": int(rounds), "reps": int(reps),
                  "single_commit_s_median": mo, "subfiles_commit_s_median": ms,
                  "single_commit_s_min": min(one), "subfiles_commit_s_min": min(sub),
                  "single_commit_s_max": max(one), "subfiles_commit_s_max": max(sub),
                  "n": len(sub), "ratio_single_over_subfiles": mo / ms,
                  "subfiles_not_slower": mo / ms >= 1.0,
                  "commit": rev, "dirty_tracked_files": int(dirty),
                  "load_before": load_before, "load_after": " ".join(open("/proc/loadavg").read().split()[:3]),
                  "launcher": "srun --mpi=pmix (slurm/local-cluster.sh, 4 nodes)"})
with open(out, "w") as f:
    for l in lines:
        f.write(json.dumps(l, sort_keys=True) + "\n")
for l in lines:
    if l["kind"] == "summary":
        print("%s: single %.3f s, subfiles %.3f s (medians, n=%d): single/subfiles %.2f" % (
            l["case"], l["single_commit_s_median"], l["subfiles_commit_s_median"], l["n"],
            l["ratio_single_over_subfiles"]))
print("wrote " + out)
PY
