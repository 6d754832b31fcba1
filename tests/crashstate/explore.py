#!/usr/bin/python3
"""Crash states, not only crashes (docs/TESTING.md "Crash states").

Records the file-system operations of a real save at NP ranks (record_fs, an
LD_PRELOAD shim), builds the states a power loss could leave on disk
(fsmodel.py: every cut of the operation order, with what was not yet durable
dropped or kept), and checks each distinct state with the public API
(state_job check: Open, Steps, Restore compared byte for byte from each tier
that lists the step, Verify) and, for a sample, with the mhckpt CLI (list,
verify --all):

  (a) no committed step fails Restore or Verify; with --local, no step the
      local tier lists (Steps().local) fails a restore from the local tier;
  (b) the step committed before the recorded save is always committed and
      restores (with --max-to-keep 1 the save may delete it, but only once the
      new step is durably committed); with --local, the newest local step
      before the save stays in the local tier, also while the save recycles
      the oldest one (--local-keep steps saved before it, the default);
  (c) the new step is committed only in states where its data files are whole
      (byte-identical to the files the save left: data.h5, the subfiles and
      index.bin, or whatever files another engine writes in the step
      directory); with --local, the new local step is listed only where every
      node that shows its marker holds its files of the step whole (its own
      writer file, the copies it keeps, its parity block).

    explore.py --job state_job --shim librecord_fs.so --work DIR \\
        --mpiexec "mpiexec --oversubscribe ..." [--np 2] [--check-np 1] \\
        [--model ext4,posix] [--max-states 300] [--random-per-cut 4] [--seed 1] \\
        [--granularity page|write] [--cli mhckpt --cli-sample 3] [--max-to-keep K] \\
        [--collective] [--rows 512] [--files K] [--format V] \\
        [--local [--nodes N] [--copies C] [--parity G] [--local-keep K]] [--before N] \\
        [--controls nofsync,nodirfsync]

With --local the recorded tree holds the shared root (shared/) and one local
directory per simulated node (local/n<k>/), all on one durable file system
modelled as above: the explorer assumes a local dir on a disk (NVMe), where
only fsync makes bytes durable, not a tmpfs (whose contents a power loss
takes whole).

The controls remove fsyncs from the trace, as a library that forgot them would
have made it, and must find violations, which shows that the checks can fail:
`nofsync` the fsyncs of the new step's files (ext4 model), `nodirfsync` the
fsync of each new step directory before its marker is renamed into it (posix
model: the marker can outlive the names of the files beside it; a library
without that fsync once committed such steps). Exit status: 0 if every state
passed (and every control found its violation), 1 otherwise.
"""
import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsmodel  # noqa: E402

JOB_TIMEOUT = 120


def step_dir_name(step):
    return "step_%010d" % step


def job_flags(a):
    """The state_job options of both modes (save and check)."""
    out = ["--rows", a.rows, "--files", a.files, "--format", a.format]
    if a.local:
        out += ["--local", "--nodes", a.nodes, "--copies", a.copies, "--parity", a.parity,
                "--local-keep", a.local_keep]
    return out


class Runner:
    """Runs the job and the CLI under mpiexec."""

    def __init__(self, args):
        self.args = args
        self.mpiexec = shlex.split(args.mpiexec)

    def mpi(self, np, prog, *argv, env=(), wrap=(), timeout=JOB_TIMEOUT):
        cmd = self.mpiexec + [self.args.np_flag, str(np)]
        for k, v in env:
            cmd += ["-x", "%s=%s" % (k, v)]
        cmd += list(wrap) + [prog] + [str(a) for a in argv]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def save(self, root, first, last, env=(), wrap=()):
        a = self.args
        extra = job_flags(a) + (["--collective"] if a.collective else [])
        if last == a.new and a.max_to_keep:
            extra += ["--max-to-keep", a.max_to_keep]
        rc, out, err = self.mpi(a.np, a.job, "save", root, first, last, *extra, env=env,
                                wrap=wrap)
        if rc != 0:
            raise RuntimeError("save %d..%d failed (%d):\n%s%s" % (first, last, rc, out, err))


# ---- recording ----

STRACE_KINDS = {
    "write": "write", "pwrite64": "write", "pwritev": "write", "pwritev2": "write",
    "writev": "write", "ftruncate": "truncate", "truncate": "truncate", "fallocate": "fallocate",
    "fsync": "fsync", "fdatasync": "fsync", "mkdir": "mkdir", "mkdirat": "mkdir",
    "rename": "rename", "renameat": "rename", "renameat2": "rename", "unlink": "unlink",
    "unlinkat": "unlink", "rmdir": "rmdir"}
STRACE_CALLS = ",".join(sorted(set(STRACE_KINDS) | {
    "openat", "open", "creat", "link", "linkat", "symlink", "symlinkat", "copy_file_range",
    "sendfile", "io_submit", "io_uring_enter", "msync", "sync_file_range", "sync", "syncfs"}))


def strace_counts(sdir, root):
    """Successful state-changing calls on paths under root, by kind, from
    the strace -f -y output files in sdir; calls the model does not know of
    (link, io_submit, ...) on the root are counted as "unknown"."""
    counts = {}
    for name in os.listdir(sdir):
        with open(os.path.join(sdir, name), errors="replace") as f:
            for line in f:
                call = line.split("(", 1)[0].strip()
                if root not in line or " = -1 " in line:
                    continue
                k = STRACE_KINDS.get(call)
                if call == "unlinkat" and "AT_REMOVEDIR" in line:
                    k = "rmdir"
                if k is None and call not in ("openat", "open", "creat", "sync_file_range"):
                    k = "unknown"
                if k:
                    counts[k] = counts.get(k, 0) + 1
    return counts


def shim_counts(events):
    alias = {"fdatasync": "fsync", "truncate_path": "truncate"}
    counts = {}
    for e in events:
        k = alias.get(e["op"], e["op"])
        if e["ret"] >= 0 and k in STRACE_KINDS.values():
            counts[k] = counts.get(k, 0) + 1
    return counts


def record(runner, work):
    """Saves the steps before (1..keep), snapshots the root (after sync),
    saves the new step under the shim (and strace, with --strace-check, when
    there is one: both see the same calls), snapshots the result. Returns
    (root, log dir, seconds, strace counts or None). With --local the root
    is the tree of the shared root and the nodes' local dirs."""
    a = runner.args
    root = os.path.realpath(os.path.join(work, "root"))
    rec = os.path.join(work, "rec")
    os.makedirs(rec)
    runner.save(root, 1, a.keep)
    os.sync()
    shutil.copytree(root, os.path.join(work, "base"))
    env = [("LD_PRELOAD", os.path.realpath(a.shim)), ("MHCKPT_REC_ROOT", root),
           ("MHCKPT_REC_OUT", os.path.realpath(rec))]
    sdir = os.path.join(work, "strace")
    wrap = ()
    if a.strace_check and shutil.which("strace"):
        os.makedirs(sdir)
        wrap = ("strace", "-f", "-y", "-qq", "-ff", "-e", "trace=" + STRACE_CALLS,
                "-o", os.path.join(sdir, "t"))
    t = time.time()
    runner.save(root, a.new, a.new, env=env, wrap=wrap)
    seconds = time.time() - t
    shutil.copytree(root, os.path.join(work, "final"))
    return root, rec, seconds, strace_counts(sdir, root) if wrap else None


# ---- the states of one model ----

class Explorer:
    """The crash states of one trace under one model (fsmodel.py)."""

    def __init__(self, base, kinds, ops, model, rng, barriers=None):
        self.base, self.kinds, self.ops, self.model, self.rng = base, kinds, ops, model, rng
        self.at = fsmodel.forced_at(ops, barriers)
        self.meta = [op for op in ops if op.kind in fsmodel.META_OPS]
        self.meta_pos = {op.idx: i for i, op in enumerate(self.meta)}

    def cuts(self, write_cuts):
        """Where to cut: before everything, after every operation that is not
        a data write, and after `write_cuts` data writes (all of them if
        negative), spread evenly over the writes."""
        writes = [op.idx + 1 for op in self.ops if op.kind == "write"]
        if 0 <= write_cuts < len(writes):
            step = len(writes) / max(1, write_cuts)
            writes = sorted({writes[int(i * step)] for i in range(write_cuts)})
        other = [op.idx + 1 for op in self.ops if op.kind != "write"]
        return sorted(set([0] + other + writes))

    def window(self, cut):
        """(durable, free metadata, free data pieces) for a crash after ops[cut-1]."""
        forced = {op.idx for op in self.ops[:cut] if self.at[op.idx] < cut}
        free_meta = [op for op in self.ops[:cut]
                     if op.kind in fsmodel.META_OPS and op.idx not in forced]
        free_data = [op for op in self.ops[:cut] if op.kind == "write" and op.idx not in forced]
        if self.model == "ext4":  # metadata: a prefix, at least up to the last durable one
            last = max([self.meta_pos[i] for i in forced if i in self.meta_pos], default=-1)
            forced |= {m.idx for m in self.meta[:last + 1]}
            free_meta = [m for m in free_meta if self.meta_pos[m.idx] > last]
        return forced, free_meta, free_data

    def choices(self, free_meta, free_data, budget):
        """Sets of free operations to keep: the extremes, then random ones."""
        data_all = {op.idx for op in free_data}
        meta_all = {op.idx for op in free_meta}
        out = [set(), meta_all | data_all]
        if self.model == "ext4":
            for k in range(len(free_meta)):
                prefix = {m.idx for m in free_meta[:k]}
                out += [prefix, prefix | data_all]
        else:
            for m in free_meta:
                out += [{m.idx} | data_all, (meta_all - {m.idx}) | data_all]
        for _ in range(budget if free_meta or free_data else 0):
            p = self.rng.choice((0.5, 0.1, 0.9))
            keep = {op.idx for op in free_data if self.rng.random() < p}
            if self.model == "ext4":
                keep |= {m.idx for m in free_meta[:self.rng.randint(0, len(free_meta))]}
            else:
                keep |= {m.idx for m in free_meta if self.rng.random() < p}
            out.append(keep)
        return out

    def build(self, recipe):
        cut, kept = recipe
        return fsmodel.build(self.base, self.kinds, self.ops, cut, kept)

    def states(self, per_cut, write_cuts):
        """Yields (key, state, recipe) for every state generated; a recipe is
        (cut, the indices of the operations kept)."""
        for cut in self.cuts(write_cuts):
            forced, free_meta, free_data = self.window(cut)
            for keep in self.choices(free_meta, free_data, per_cut):
                recipe = (cut, frozenset(forced | keep))
                s = self.build(recipe)
                yield s.key(), s, recipe


def describe(explorer, recipe):
    cut, kept = recipe
    ops = explorer.ops
    dropped = [op for op in ops[:cut] if op.idx not in kept and op.kind not in ("fsync", "sync")]
    kinds = {}
    for op in dropped:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    return {"model": explorer.model, "cut": cut,
            "after": ops[cut - 1].describe() if cut else "(before the first operation)",
            "dropped_kinds": kinds, "dropped": [op.describe() for op in dropped[:12]]}


def new_dirs(work, new):
    """The new step's directories in the saved tree, relative to the root:
    step_N in the shared root; with --local, also local/n<k>/step_N of
    each node (and shared/step_N if the save went there too)."""
    out, final = [], os.path.join(work, "final")
    for dirpath, dirnames, _ in os.walk(final):
        if os.path.basename(dirpath) == step_dir_name(new):
            out.append(os.path.relpath(dirpath, final))
            dirnames[:] = []
    return sorted(out)


def final_files(work, dirs):
    """{relative path: bytes} of the new step's files as the save left them
    (every file of its directories but the marker): data.h5, the subfiles
    and index.bin for the HDF5 engine, the writer files, copies, parity
    blocks and parity.json of a local step."""
    out = {}
    for d in dirs:
        sdir = os.path.join(work, "final", d)
        for name in sorted(os.listdir(sdir)):
            if name != "commit.json" and os.path.isfile(os.path.join(sdir, name)):
                with open(os.path.join(sdir, name), "rb") as f:
                    out[d + "/" + name] = f.read()
    return out


def facts(state, final_data, dirs):
    """What a state shows of the new step: whether a marker of it is there
    (any directory), and for each directory whether its marker is there and
    whether its files are whole."""
    marked = [d for d in dirs if state.file_bytes(d + "/commit.json") is not None]
    whole = {d: all(state.file_bytes(rel) == b for rel, b in final_data.items()
                    if rel.startswith(d + "/")) for d in dirs}
    return {"marker": bool(marked), "marked": marked, "whole": whole}


def generate(explorer, per_cut, write_cuts, final_data, dirs, distinct):
    """Every state of `explorer` into `distinct` (key -> info); returns how
    many were generated (before removing duplicates)."""
    n = 0
    for key, s, recipe in explorer.states(per_cut, write_cuts):
        n += 1
        if key not in distinct:
            distinct[key] = {"explorer": explorer, "recipe": recipe,
                             "facts": facts(s, final_data, dirs)}
    return n


def select(distinct, max_states, rng, only_marked=False):
    """At most max_states keys: half from states showing the new marker (the
    ones a commit could be wrong in), the rest from the others. With
    only_marked (the controls), states that show a marker beside files that
    are not whole come first: the ones the checks must reject."""
    keys = sorted(distinct)
    rng.shuffle(keys)
    marked = [k for k in keys if distinct[k]["facts"]["marker"]]
    if only_marked:
        def torn(k):
            f = distinct[k]["facts"]
            return any(not f["whole"][d] for d in f["marked"])
        marked = [k for k in marked if torn(k)] + [k for k in marked if not torn(k)]
    other = [] if only_marked else [k for k in keys if not distinct[k]["facts"]["marker"]]
    n_marked = min(len(marked), max(max_states // 2, max_states - len(other)))
    return marked[:n_marked] + other[:max_states - n_marked]


# ---- checking ----

def verdict(check, info, a):
    """The violations of one checked state (a list of strings)."""
    if check.get("open") != "OK":
        return ["(b) Open failed: %s" % check.get("open")]
    out = []
    committed, local = check.get("committed", []), check.get("local", [])
    for s, r in sorted(check.get("steps", {}).items(), key=lambda kv: int(kv[0])):
        if r.get("restore", "-") not in ("OK", "-") or r.get("verify", "-") not in ("OK", "-"):
            out.append("(a) committed step %s: restore: %s; verify: %s" % (s, r["restore"],
                                                                             r["verify"]))
        if r.get("local_restore", "-") not in ("OK", "-"):
            out.append("(a) local step %s: restore from the local tier: %s"
                       % (s, r["local_restore"]))
    f = info["facts"]
    if a.local:
        if a.keep not in local:
            out.append("(b) local step %d is not in the local tier (local: %s)" % (a.keep, local))
        torn = [d for d in f["marked"] if d.startswith("local/") and not f["whole"][d]]
        if a.new in local and torn:
            out.append("(c) local step %d is listed but %s show(s) its marker without its "
                       "files whole" % (a.new, ", ".join(torn)))
    shared = [d for d in f["whole"] if not d.startswith("local/")]
    new_ok = a.new in committed and not out
    if not a.local or shared:
        if a.keep not in committed and not (a.max_to_keep > 0 and new_ok):
            out.append("(b) step %d is not committed (committed: %s)" % (a.keep, committed))
    if a.new in committed and not all(f["whole"][d] for d in shared):
        out.append("(c) step %d is committed but its data files are not whole" % a.new)
    return out


def cli_check(runner, root):
    """The mhckpt CLI on one state (before the checker's Open changes it):
    the committed steps `list` shows, and the exit status of `verify --all`."""
    a = runner.args
    if a.local:
        root = os.path.join(root, "shared")
    p = subprocess.run([a.cli, "list", root, "--json"], capture_output=True, text=True,
                       timeout=60)
    listed = sorted(s["step"] for s in json.loads(p.stdout)["steps"] if s["committed"]) \
        if p.returncode == 0 else None
    rc, out, err = runner.mpi(1, a.cli, "verify", root, "--all", timeout=60)
    return {"listed": listed, "verify_rc": rc, "verify_out": (out + err)[-400:]}


def cli_violations(check, cli):
    if cli is None or check.get("open") != "OK":
        return []
    out = []
    if cli["listed"] != sorted(check.get("committed", [])):
        out.append("CLI list shows %s, the checker %s" % (cli["listed"], check.get("committed")))
    bad = any(r["verify"] != "OK" for r in check.get("steps", {}).values())
    if (cli["verify_rc"] != 0) != bad:
        out.append("CLI verify --all exited %d: %s" % (cli["verify_rc"], cli["verify_out"]))
    return out


def run_checker(runner, roots, keys, bdir):
    """state_job check over roots[k] for k in keys; a state on which the
    checker dies is reported as such and the rest are checked again."""
    a = runner.args
    results, pending = {}, list(keys)
    while pending:
        listfile = os.path.join(bdir, "list.txt")
        with open(listfile, "w") as f:
            f.write("".join(roots[k] + "\n" for k in pending))
        rc, out, err = runner.mpi(a.check_np, a.job, "check", listfile, *job_flags(a),
                                  timeout=JOB_TIMEOUT + 5 * len(pending))
        seen = {}
        for line in out.splitlines():
            if line.startswith("CHECK "):
                j = json.loads(line[6:])
                seen[j["root"]] = j
        done = [k for k in pending if roots[k] in seen]
        for k in done:
            results[k] = seen[roots[k]]
        if len(done) == len(pending):
            break
        crashed = pending[len(done)]  # the checker died on this one
        results[crashed] = {"open": "checker exited %d on this state: %s" % (rc, err[-600:])}
        pending = pending[len(done) + 1:]
    return results


def check_batch(runner, batch, work, cli_keys):
    """Materialises `batch` (key, info), runs the CLI on those in cli_keys,
    then the checker on all; returns {key: (check, cli result or None)}."""
    bdir = os.path.join(work, "batch")
    shutil.rmtree(bdir, ignore_errors=True)
    os.makedirs(bdir)
    roots, cli = {}, {}
    for i, (key, info) in enumerate(batch):
        roots[key] = os.path.join(bdir, "s%04d" % i, "root")
        info["explorer"].build(info["recipe"]).materialise(roots[key])
        if key in cli_keys:
            cli[key] = cli_check(runner, roots[key])
    results = run_checker(runner, roots, [k for k, _ in batch], bdir)
    shutil.rmtree(bdir, ignore_errors=True)
    return {k: (results[k], cli.get(k)) for k, _ in batch}


def check_all(runner, work, chosen, distinct, cli_sample, batch_size=40):
    """Checks every chosen state; returns (violations, CLI runs)."""
    a = runner.args
    cli_keys = set()
    if a.cli and cli_sample:
        marked = [k for k in chosen if distinct[k]["facts"]["marker"]]
        other = [k for k in chosen if not distinct[k]["facts"]["marker"]]
        n_marked = min(len(marked), max((cli_sample + 1) // 2, cli_sample - len(other)))
        cli_keys = set(marked[:n_marked] + other[:cli_sample - n_marked])
    violations = []
    for i in range(0, len(chosen), batch_size):
        batch = [(k, distinct[k]) for k in chosen[i:i + batch_size]]
        for key, (check, cli) in check_batch(runner, batch, work, cli_keys).items():
            info = distinct[key]
            info["check"] = check
            bad = verdict(check, info, a) + cli_violations(check, cli)
            if bad:
                keep_dir = os.path.join(work, "violations", key[:12])
                shutil.rmtree(keep_dir, ignore_errors=True)
                info["explorer"].build(info["recipe"]).materialise(os.path.join(keep_dir, "root"))
                violations.append({"state": key[:12], "kept_in": keep_dir, "problems": bad,
                                   "facts": info["facts"], "check": check,
                                   "how": describe(info["explorer"], info["recipe"])})
    return violations, len(cli_keys)


# ---- the run ----

def load(work, root, rec, granularity):
    """The trace as model operations, checked against reality: all of them
    kept must give the root the save left, none of them the snapshot."""
    events = fsmodel.read_logs(rec)
    base = fsmodel.Base(os.path.join(work, "base"))
    ops, kinds, ignored = fsmodel.parse(events, base, root, granularity)
    everything = fsmodel.build(base, kinds, ops, len(ops))
    if everything.key() != fsmodel.tree_key(os.path.join(work, "final")):
        raise fsmodel.TraceError("the trace replayed in full does not give the saved root: "
                                 "the recorder missed an operation")
    if fsmodel.build(base, kinds, ops, 0).key() != base_key(base):
        raise fsmodel.TraceError("the empty replay differs from the snapshot")
    return events, base, ops, kinds, ignored


def base_key(base):
    return fsmodel.State(base, base.kinds).key()


def trace_stats(events, ops):
    kinds = {}
    for op in ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    return {"calls_logged": len(events), "processes": len({e["pid"] for e in events}),
            "model_ops": len(ops), "by_kind": kinds,
            "writes": len({op.wid for op in ops if op.kind == "write"}),
            "bytes_written": sum(len(op.data) for op in ops if op.kind == "write")}


def explore(runner, work, base, kinds, ops, final_data, dirs, rng, models, barriers=None,
            max_states=None, only_marked=False):
    """Generates the states of every model, checks a bounded selection."""
    a = runner.args
    distinct, generated = {}, {}
    for model in models:
        ex = Explorer(base, kinds, ops, model, rng, barriers)
        generated[model] = generate(ex, a.random_per_cut, a.write_cuts, final_data, dirs,
                                    distinct)
    chosen = select(distinct, max_states or a.max_states, rng, only_marked)
    violations, cli_runs = check_all(runner, work, chosen, distinct,
                                     0 if barriers else a.cli_sample)
    return {"generated": generated, "distinct": len(distinct),
            "distinct_with_new_marker": sum(1 for d in distinct.values() if d["facts"]["marker"]),
            "checked": len(chosen),
            "checked_with_new_marker": sum(1 for k in chosen if distinct[k]["facts"]["marker"]),
            "cli_checked": cli_runs, "violations": violations}


def control(name, runner, work, base, kinds, ops, final_data, dirs, rng):
    """The trace with some fsyncs removed, as a library that forgot them
    would have made it; the checks must find violations.
      nofsync     the fsyncs of the new step's files (ext4 model): data.h5,
                  subfiles, index.bin; with --local the writer files, copies
                  and parity blocks of every node
      nodirfsync  the fsync of each new step directory before its marker's
                  rename (posix model: the marker can outlive the names of
                  the files beside it). A local step written into a recycled
                  directory creates no names but the marker's (its files
                  are overwritten in place), so this control needs a save
                  into a fresh directory (--before below --local-keep).
    """
    renames = {d: next((op for op in ops if op.kind == "rename" and
                        op.path2 == d + "/commit.json"), None) for d in dirs}
    if name == "nofsync":
        model, drop = "ext4", lambda op: op.path in final_data
    elif name == "nodirfsync":
        model = "posix"

        def drop(op):
            r = renames.get(op.path)
            return r is not None and op.t1 < r.t0
    else:
        raise SystemExit("unknown control %s" % name)
    fsyncs = [op for op in ops if op.kind in ("fsync", "sync")]
    barriers = [op for op in fsyncs if not drop(op)]
    r = explore(runner, work, base, kinds, ops, final_data, dirs, rng, [model], barriers,
                max_states=runner.args.control_states, only_marked=True)
    r["fsyncs_removed"] = len(fsyncs) - len(barriers)
    r["passed"] = r["fsyncs_removed"] > 0 and len(r["violations"]) > 0
    return r


def git_commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True, help="state_job")
    p.add_argument("--shim", required=True, help="librecord_fs.so")
    p.add_argument("--work", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--np-flag", default="-n")
    p.add_argument("--np", type=int, default=2, help="ranks of the recorded save")
    p.add_argument("--check-np", type=int, default=1, help="ranks of the checker")
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--max-to-keep", type=int, default=0)
    p.add_argument("--collective", action="store_true")
    p.add_argument("--files", type=int, default=0, help="DataFiles::PerRanks(K) (0: data.h5)")
    p.add_argument("--format", type=int, default=3, help="Options::format_version")
    p.add_argument("--local", action="store_true",
                   help="the local tier on, nodes simulated by node id")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--copies", type=int, default=1)
    p.add_argument("--parity", type=int, default=0)
    p.add_argument("--local-keep", type=int, default=2)
    p.add_argument("--before", type=int, default=0,
                   help="steps saved before the recorded one (default: 1; with --local, "
                   "--local-keep, so that the recorded save recycles the oldest)")
    p.add_argument("--model", default="ext4,posix")
    p.add_argument("--granularity", choices=("page", "write"), default="page")
    p.add_argument("--max-states", type=int, default=300, help="distinct states checked")
    p.add_argument("--random-per-cut", type=int, default=4)
    p.add_argument("--write-cuts", type=int, default=40,
                   help="cuts among the data writes (-1: after every one)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cli", help="the mhckpt CLI")
    p.add_argument("--cli-sample", type=int, default=0)
    p.add_argument("--controls", default="nofsync,nodirfsync", help="'' for none")
    p.add_argument("--control-states", type=int, default=30)
    p.add_argument("--strace-check", action="store_true")
    p.add_argument("--json", help="write the summary here too")
    a = p.parse_args(argv)
    # The steps saved before the recorded one: 1 (shared root), or
    # local-keep of them, so that the recorded save recycles the oldest.
    a.keep = a.before or (a.local_keep if a.local else 1)
    a.new = a.keep + 1
    if a.local and a.check_np < a.nodes:
        p.error("--check-np must be at least --nodes (every node's dir must have a rank)")
    return a


def report(summary):
    s = summary
    print("trace: %(calls_logged)d calls from %(processes)d processes -> %(model_ops)d model "
          "operations (%(writes)d writes, %(bytes_written)d bytes) %(by_kind)s" % s["trace"])
    if s.get("strace"):
        print("strace saw the same calls: %s" % s["strace"])
    print("saved steps 1..%d, recorded the save of step %d; its directories: %s"
          % (s["keep"], s["new"], ", ".join(s["new_dirs"])))
    r = s["result"]
    print("states: generated %s, distinct %d (%d with the new marker), checked %d (%d with the "
          "new marker, %d also with the CLI) at %d rank(s)"
          % (r["generated"], r["distinct"], r["distinct_with_new_marker"], r["checked"],
             r["checked_with_new_marker"], r["cli_checked"], s["check_np"]))
    for v in r["violations"][:20]:
        print("VIOLATION %s\n  %s" % ("\n  ".join(v["problems"]), json.dumps(v["how"])))
    for name, c in s["controls"].items():
        print("control %s: %d fsyncs removed, %d states checked, %d violations found: %s"
              % (name, c["fsyncs_removed"], c["checked"], len(c["violations"]),
                 "as expected" if c["passed"] else "FAILED (the checks cannot fail?)"))
    print("%s in %.0f s (commit %s)" % ("PASS" if s["passed"] else "FAIL", s["seconds"],
                                       s["commit"]))


def main(argv):
    a = parse_args(argv)
    t0 = time.time()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    runner = Runner(a)
    rng = random.Random(a.seed)
    root, rec, save_seconds, strace = record(runner, a.work)
    events, base, ops, kinds, ignored = load(a.work, root, rec, a.granularity)
    dirs = new_dirs(a.work, a.new)
    summary = {"commit": git_commit(), "np": a.np, "check_np": a.check_np, "rows": a.rows,
               "models": a.model, "granularity": a.granularity, "seed": a.seed,
               "files": a.files, "format": a.format, "local": a.local, "keep": a.keep,
               "new": a.new, "new_dirs": dirs,
               "trace": trace_stats(events, ops), "ignored_calls": ignored,
               "recorded_save_seconds": round(save_seconds, 2), "controls": {}}
    passed = True
    if strace is not None:
        mine = shim_counts(events)
        summary["strace"] = strace
        if strace != mine:
            print("strace counted %s, the shim %s" % (strace, mine))
            passed = False
    if a.local:
        summary.update(nodes=a.nodes, copies=a.copies, parity=a.parity, local_keep=a.local_keep)
    final_data = final_files(a.work, dirs)
    summary["new_files"] = sorted(final_data)
    summary["result"] = explore(runner, a.work, base, kinds, ops, final_data, dirs, rng,
                                a.model.split(","))
    passed = passed and not summary["result"]["violations"]
    for c in filter(None, a.controls.split(",")):
        summary["controls"][c] = control(c, runner, a.work, base, kinds, ops, final_data, dirs,
                                         rng)
        passed = passed and summary["controls"][c]["passed"]
    summary["passed"], summary["seconds"] = passed, time.time() - t0
    report(summary)
    for path in filter(None, [a.json, os.path.join(a.work, "summary.json")]):
        with open(path, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
