#!/usr/bin/env python3
"""The cost of saving at every step, of a preemption save and of recovery at
1,000 nodes, and the work lost per failure, as a model (docs/SCALE.md, §7).

    python3 bench/scale_model.py                 # the table docs/SCALE.md shows
    python3 bench/scale_model.py --pfs-gbs 100   # another file system
    python3 bench/scale_model.py --params        # every parameter and where it comes from

Nothing here is measured at 1,000 nodes. The per-node costs mhckpt adds are
taken from this machine's records in bench/results/ where one exists (the
memcpy rate of the two-tier benchmark), the hardware and the job are stated
parameters, and the rest is arithmetic: each line of the table says which.
"""
import argparse
import glob
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

GB = 1e9


def measured_memcpy_gbs():
    """Host memcpy rate of one core, from the newest two-tier record (GB/s), and the record."""
    import docs_tables  # noqa: PLC0415 (bench/docs_tables.py reads the records)

    found = sorted(glob.glob(os.path.join(HERE, "results", "tiers-*.json.gz")))
    if not found:
        return 10.0, "stated (no tiers record)"
    # The run with one rank per node: a core to itself on this 2-core machine
    # (of a record of two builds, the newer: its rows come last).
    r = min(reversed(docs_tables.load(found[-1])), key=lambda r: r["ranks_per_node"])
    rate = r["mib_per_rank"] * (1 << 20) / r["baseline_memcpy_s"] / GB
    return rate, f"`bench/results/{os.path.basename(found[-1])}`, one rank per node"


def measured_lazy():
    """Lazy save on this machine, np 1, from the newest stall record: the blocking part over the
    memcpy of the same bytes, and the slowdown of compute that overlaps the copy."""
    import docs_tables  # noqa: PLC0415

    found = sorted(glob.glob(os.path.join(HERE, "results", "stall-*.json.gz")))
    if not found:
        return 0.01, 0.05, "stated (no stall record)"
    r = max((r for r in docs_tables.load(found[-1]) if r["ranks"] == 1), key=lambda r: r["mib"])
    return (r["lazy_stall_vs_memcpy"], r["compute_slowdown"] - 1,
            f"`bench/results/{os.path.basename(found[-1])}`, np 1, {r['mib']:.0f} MiB")


def parameters(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--params-b", type=float, default=70, help="model parameters, billions")
    p.add_argument("--state-bytes-per-param", type=float, default=14,
                   help="bf16 weights + fp32 master + Adam m, v (2 + 4 + 4 + 4)")
    p.add_argument("--step-s", type=float, default=2.0, help="training step time")
    p.add_argument("--d2h-gbs", type=float, default=25, help="device-to-host copy per GPU, pinned")
    p.add_argument("--net-gbs", type=float, default=50, help="network per node (one 400 Gb/s port)")
    p.add_argument("--pfs-gbs", type=float, default=1000, help="shared file system, aggregate write and read")
    p.add_argument("--gpu-mtbf-h", type=float, default=16384 * 54 * 24 / 419,
                   help="per-GPU mean time between job interruptions (Llama 3: 419 in 54 days on 16,384 GPUs)")
    p.add_argument("--restart-s", type=float, default=120,
                   help="scheduler requeue, process start, communicator setup: not mhckpt's")
    p.add_argument("--grace-s", type=float, default=30, help="preemption grace period (Slurm's KillWait default)")
    p.add_argument("--agree-us", type=float, default=50,
                   help="one small non-blocking allreduce over all ranks (per-step agreement), overlapped")
    p.add_argument("--params", action="store_true", help="print the parameters and stop")
    return p.parse_args(argv)


def model(a):
    memcpy_gbs, memcpy_src = measured_memcpy_gbs()
    lazy_vs_copy, overlap_slowdown, lazy_src = measured_lazy()
    gpus = a.nodes * a.gpus_per_node
    state = a.params_b * 1e9 * a.state_bytes_per_param  # bytes, whole job
    per_node = state / a.nodes
    per_gpu = state / gpus
    mtbf = a.gpu_mtbf_h * 3600 / gpus  # seconds between interruptions of this job

    snapshot = per_gpu / (a.d2h_gbs * GB)  # blocking part of a save: every GPU at once
    # A lazy save blocks for a sliver of the copy; the copy then slows the
    # compute it overlaps by the measured fraction.
    lazy = snapshot * (lazy_vs_copy + overlap_slowdown)
    # In the background, per node: the staged bytes into the local tier's file
    # (one memcpy per GPU's share, a core each) and the same bytes to the partner node.
    local_commit = max(per_gpu / (memcpy_gbs * GB), per_node / (a.net_gbs * GB))
    shared = state / (a.pfs_gbs * GB)
    lag = 2 * a.step_s  # a notice is acted on one or two steps later
    preempt_local = lag + snapshot + local_commit
    preempt_shared = preempt_local + shared
    recover_node = max(per_node / (a.net_gbs * GB), per_gpu / (memcpy_gbs * GB)) + per_gpu / (a.d2h_gbs * GB)
    recover_crash = per_gpu / (memcpy_gbs * GB) + per_gpu / (a.d2h_gbs * GB)

    def young(delta):  # Young's interval and Daly's first-order correction
        t = math.sqrt(2 * delta * mtbf)
        return t - delta if delta < 2 * mtbf else mtbf

    def waste(delta, interval, recover, restart):  # fraction of time lost: saving, rework, restart
        return delta / interval + (interval / 2 + recover + restart) / mtbf

    policies = [
        ("blocking save to the shared root, Young/Daly interval", shared, max(young(shared), shared), shared),
        ("async save to the shared root, Young/Daly interval (≥ one write)", snapshot,
         max(young(snapshot), shared), shared),
        ("every step to the local tier, blocking copy", snapshot, a.step_s, recover_node),
        ("every step to the local tier, lazy copy", lazy, a.step_s, recover_node),
    ]
    return {
        "memcpy_gbs": memcpy_gbs, "memcpy_src": memcpy_src, "lazy": lazy, "lazy_src": lazy_src,
        "lazy_vs_copy": lazy_vs_copy, "overlap_slowdown": overlap_slowdown, "gpus": gpus, "state": state, "per_node": per_node,
        "per_gpu": per_gpu, "mtbf": mtbf, "snapshot": snapshot, "local_commit": local_commit, "shared": shared,
        "lag": lag, "preempt_local": preempt_local, "preempt_shared": preempt_shared,
        "recover_node": recover_node, "recover_crash": recover_crash,
        "policies": [(n, d, i, i / 2, waste(d, i, r, 0), waste(d, i, r, a.restart_s)) for n, d, i, r in policies],
    }


def s(v):
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.1f} s"


def render(a, m):
    out = [
        f"{a.nodes:,} nodes x {a.gpus_per_node} GPUs, a {a.params_b:g}B model with "
        f"{a.state_bytes_per_param:g} bytes of state per parameter: {m['state'] / 1e12:.2f} TB, "
        f"{m['per_node'] / GB:.2f} GB per node, {m['per_gpu'] / 1e6:.0f} MB per GPU; a {a.step_s:g} s step; "
        f"{a.d2h_gbs:g} GB/s device-to-host per GPU, {a.net_gbs:g} GB/s network per node, a "
        f"{a.pfs_gbs:g} GB/s file system; host memcpy {m['memcpy_gbs']:.1f} GB/s per core ({m['memcpy_src']}); "
        f"a lazy save blocks {m['lazy_vs_copy']:.4f}x the copy and slows the compute it overlaps by "
        f"{100 * m['overlap_slowdown']:.1f} % ({m['lazy_src']}); "
        f"one interruption every {m['mtbf'] / 3600:.1f} h; restart {a.restart_s:g} s.",
        "",
        "| what | model | time |",
        "| --- | --- | --- |",
        f"| blocking part of a save (every step) | per-GPU state / device-to-host | {s(m['snapshot'])} "
        f"({100 * m['snapshot'] / a.step_s:.2f} % of a step) |",
        f"| the same, lazy: its blocking part, plus the slowdown of the compute it overlaps | "
        f"copy x (blocking fraction + slowdown) | {s(m['lazy'])} ({100 * m['lazy'] / a.step_s:.3f} % of a step) |",
        f"| local commit, in the background | max(per-GPU state / memcpy, per-node state / network) | "
        f"{s(m['local_commit'])} |",
        f"| per-step agreement (preemption, continuous saving) | one small non-blocking allreduce | "
        f"{a.agree_us:g} µs, overlapped |",
        f"| shared-root write, in the background | state / file system | {s(m['shared'])} |",
        f"| preemption: notice to a committed local step | two steps + blocking part + local commit | "
        f"{s(m['preempt_local'])} of {a.grace_s:g} s |",
        f"| preemption: notice to a committed shared-root step | + state / file system | "
        f"{s(m['preempt_shared'])} of {a.grace_s:g} s"
        + ("" if m["preempt_shared"] <= a.grace_s else " **too late**") + " |",
        f"| recovery, a node lost | max(per-node state / network, per-GPU state / memcpy) + host-to-device | "
        f"{s(m['recover_node'])} |",
        f"| recovery, processes crashed, nodes up | per-GPU state / memcpy + host-to-device | "
        f"{s(m['recover_crash'])} |",
        f"| cold restore from the shared root | state / file system | {s(m['shared'])} |",
        "",
        "| policy | blocking per save | interval | work lost per failure | time lost: saving, rework, recovery "
        "| with the restart |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, delta, interval, lost, w, w_restart in m["policies"]:
        out.append(f"| {name} | {s(delta)} | {s(interval)} | {s(lost)} + restart | {100 * w:.2f} % "
                   f"| {100 * w_restart:.2f} % |")
    return "\n".join(out) + "\n"


def main(argv):
    a = parameters(argv)
    if a.params:
        for k, v in sorted(vars(a).items()):
            print(f"{k} = {v}")
        return 0
    sys.stdout.write(render(a, model(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
