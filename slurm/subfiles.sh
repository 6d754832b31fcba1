#!/usr/bin/env bash
# Subfiles on a real Slurm cluster (slurm/local-cluster.sh: 4 nodes on this
# machine, each in its own namespaces): the demo trains with a data file per
# node (--files node, Options::files), and the checkpoint is resumed at other
# world sizes on the same 4 nodes:
#
#   A: 16 ranks (4 per node) train to step 20, saving steps 10 and 20
#   B: 32 ranks (8 per node) resume step 20 and train to 40 (saves 30, 40)
#   C: 16 ranks resume step 40 and train to 50 (saves 50)
#
# It fails unless: each resume restores the fingerprint its step was saved with
# (saved at N, restored at M); every committed step has one subfile per node
# (data-00000.h5 .. data-00003.h5, "files": 4 in its marker); the fingerprint
# of every step computed from data.h5 alone with h5py (demo/fingerprint.py,
# through data.h5's virtual datasets) is the one its job printed; and
# `mhckpt verify --all` passes.
#
#   slurm/subfiles.sh [BUILD_DIR=build]
#
# Environment: WORK (default /var/tmp/mhckpt-subfiles; on a file system every
# node sees), MHCKPT_SLURM_BASE (default /tmp/mhckpt-sub), MHCKPT_SLURM_PORT
# (default 17300), MODEL_MIB (default 16), KEEP_CLUSTER=1 leaves it up.
# Needs root and scripts/bootstrap.sh's packages (slurm-wlm, munge, h5py).
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
demo=$build/bin/mhckpt-train-demo
cli=$build/bin/mhckpt
WORK=${WORK:-/var/tmp/mhckpt-subfiles}
MODEL_MIB=${MODEL_MIB:-16}
export MHCKPT_SLURM_BASE=${MHCKPT_SLURM_BASE:-/tmp/mhckpt-sub}
export MHCKPT_SLURM_PORT=${MHCKPT_SLURM_PORT:-17300}
export MHCKPT_SLURM_CPUS=8 # up to 8 ranks per node
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
root=$WORK/ckpt
rm -rf "$WORK" && mkdir -p "$WORK/logs"

slurm/local-cluster.sh up 4 >/dev/null
export SLURM_CONF=$MHCKPT_SLURM_BASE/slurm.conf
[ "${KEEP_CLUSTER:-0}" = 1 ] || trap 'slurm/local-cluster.sh down >/dev/null 2>&1 || true' EXIT

# One job of 4 nodes x TPN ranks; retried (up to 3 launches) where Open MPI
# under srun fails to start (slurm/stress.py, "launch"), each retry from the
# checkpoint as the last attempt left it (a resume, or a fresh root for A).
# Every launch keeps its own log (NAME.K.log) and, in NAME.K.expect, the newest
# committed step when it started (the step a resume must restore).
newest_committed() {
  local d s=""
  for d in "$root"/step_*; do # in order: the names are zero-padded
    [ -f "$d/commit.json" ] && s=${d##*/step_}
  done
  if [ -n "$s" ]; then echo $((10#$s)); else echo none; fi
}
run() {
  local name=$1 tpn=$2
  shift 2
  for attempt in 1 2 3; do
    [ "$name" = A ] && rm -rf "$root"
    newest_committed >"$WORK/logs/$name.$attempt.expect"
    if srun -N 4 --ntasks-per-node="$tpn" --mpi=pmix --kill-on-bad-exit=1 \
      "$demo" --dir "$root" --files node --model-mib "$MODEL_MIB" --save-every 10 --max-to-keep 0 "$@" \
      >"$WORK/logs/$name.$attempt.log" 2>&1; then
      echo "job $name: $((4 * tpn)) ranks on 4 nodes: ok (launch $attempt)"
      return 0
    fi
    echo "job $name: launch $attempt failed: $(tail -1 "$WORK/logs/$name.$attempt.log")"
  done
  return 1
}

run A 4 --steps 20
run B 8 --steps 40 --resume
run C 4 --steps 50 --resume

"$cli" verify "$root" --all >"$WORK/logs/verify.log" 2>&1 || {
  cat "$WORK/logs/verify.log"
  exit 1
}
echo "mhckpt verify --all: $(tail -1 "$WORK/logs/verify.log")"

/usr/bin/python3 - "$root" "$WORK/logs" <<'PY'
import json, os, re, sys
sys.path.insert(0, "demo")
from fingerprint import file_fingerprint
root, logs = sys.argv[1], sys.argv[2]
saved, restores, problems = {}, [], []
for job, ranks in (("A", 16), ("B", 32), ("C", 16)):
    for attempt in (1, 2, 3):  # in launch order: a later save of a step wins
        path = os.path.join(logs, "%s.%d.log" % (job, attempt))
        if not os.path.exists(path):
            break
        text = open(path).read()
        expect = open(os.path.join(logs, "%s.%d.expect" % (job, attempt))).read().strip()
        for m in re.finditer(r"^saving step=(\d+) fingerprint ([0-9a-f]{16})$", text, re.M):
            saved[int(m.group(1))] = (m.group(2), ranks)
        if job == "A":
            continue
        # The resumed state, printed right after "restored step=...".
        m = re.search(r"^restored step=(\d+) .*\n(?:.*\n)*?fingerprint step=(\d+) ([0-9a-f]{16})$", text, re.M)
        if m is None or m.group(1) != m.group(2):
            if "restored step=" in text or attempt == 3 or not os.path.exists(
                    os.path.join(logs, "%s.%d.log" % (job, attempt + 1))):
                problems.append("job %s launch %d printed no restored fingerprint" % (job, attempt))
            continue
        restores.append((job, attempt, int(m.group(1)), m.group(3), ranks, expect))
for job, attempt, step, fp, ranks, expect in restores:
    want, at = saved.get(step, (None, None))
    ok = fp == want
    print("job %s: step %d saved at %s ranks, restored at %d ranks: %s %s %s" % (
        job, step, at, ranks, want, "==" if ok else "!=", fp))
    if not ok:
        problems.append("step %d restored with another fingerprint (saved %s, restored %s)" % (step, want, fp))
    if str(step) != expect:
        problems.append("job %s launch %d restored step %d, the newest committed was %s" % (job, attempt, step, expect))
if sorted({j for j, *_ in restores}) != ["B", "C"]:
    problems.append("restores seen: %s (want B and C)" % sorted({j for j, *_ in restores}))
steps = sorted(int(d[5:]) for d in os.listdir(root) if d.startswith("step_"))
for step in steps:
    d = os.path.join(root, "step_%010d" % step)
    files = json.load(open(os.path.join(d, "commit.json"))).get("files")
    subfiles = sorted(n for n in os.listdir(d) if re.match(r"data-\d{5}\.h5$", n))
    fp = file_fingerprint(d)
    want = saved.get(step, (None,))[0]
    print("step %d: %d subfiles (\"files\": %s); fingerprint from data.h5 %s, printed %s" % (
        step, len(subfiles), files, fp, want))
    if files != 4 or subfiles != ["data-%05d.h5" % g for g in range(4)]:
        problems.append("step %d: subfiles %s, files %s" % (step, subfiles, files))
    if fp != want:
        problems.append("step %d: data.h5 holds fingerprint %s, the job saved %s" % (step, fp, want))
if steps != [10, 20, 30, 40, 50]:
    problems.append("committed steps %s" % steps)
print("FAIL:\n  " + "\n  ".join(problems) if problems else "subfiles: ok")
sys.exit(1 if problems else 0)
PY
