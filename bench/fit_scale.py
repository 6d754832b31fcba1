#!/usr/bin/python3
"""The cost model of docs/SCALE.md fitted to bench/run_plan_sim.sh's records.

    bench/fit_scale.py bench/results/plan-sim-DATE.jsonl

Rank 0's CPU time of the deduplicated plan round is fitted, by least squares,
as  t = a * L*A + b * N*A/PP : decoding and checking the L distinct layouts
of A arrays, and adding N ranks as holders of their A/PP boxes each (the plan's
K boxes grow with A here, so they are not told apart). Prints the table and
the coefficients.
"""
import json
import sys

import numpy as np


def main():
    rows = [json.loads(line) for line in open(sys.argv[1])]
    print("| model | ranks | arrays | layouts | rank 0 CPU s | wall s | peak MB | gathered MB (no dedup) | plan MB | boxes | max/mean | RP boxes | RP plan MB | RP max/mean | parse s (RP) | commit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    x, y = [], []
    for r in rows:
        p, rp = r["plan"], r["plan_replica_parallel"]
        n, a, pp, layouts = r["ranks"], r["arrays"], r["pp"], p["layouts"]
        k = p["balance"]["boxes"]
        x.append([layouts * a, n * a / pp])
        y.append(p["root_cpu_seconds"])
        print("| %s | %d | %d | %d | %.3f | %.3f | %.0f | %.0f (%.0f) | %.1f | %d | %.3f | %d | %.1f | %.3f | %.2f | %s |" % (
            r["model"], n, a, layouts, p["root_cpu_seconds"], p["root_seconds"],
            p["root_peak_bytes"] / 1e6, r["gather_dedup"]["bytes"] / 1e6,
            r["gather_without_dedup"]["bytes"] / 1e6, p["plan_json_bytes"] / 1e6, k,
            p["balance"]["max_over_mean"], rp["balance"]["boxes"], rp["plan_json_bytes"] / 1e6,
            rp["balance"]["max_over_mean"], rp["parse_seconds_per_rank"], r["commit"]))
    for r in rows:
        if "plan_without_dedup" in r:
            f = r["plan_without_dedup"]
            print("without dedup: %s %d ranks x %d arrays: rank 0 CPU %.2f s, peak %.0f MB, same plan %s"
                  % (r["model"], r["ranks"], r["arrays"], f["root_cpu_seconds"],
                     f["root_peak_bytes"] / 1e6, f.get("same_plan")))
    coef, *_ = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)
    print("fit: t = %.3g * L*A + %.3g * N*A/PP  (seconds)" % tuple(coef))
    for n, a, layouts, pp in [(8000, 10000, 32, 4), (8000, 10000, 64, 8), (16000, 10000, 128, 16),
                              (8000, 100000, 64, 8), (8000, 10000, 8000, 8)]:
        print("  predicted N=%d A=%d L=%d PP=%d: %.2f s" % (n, a, layouts, pp,
              coef[0] * layouts * a + coef[1] * n * a / pp))


if __name__ == "__main__":
    main()
