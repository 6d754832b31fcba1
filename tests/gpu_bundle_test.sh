#!/usr/bin/env bash
# The offline GPU bundle proved here (docs/TESTING.md, "The GPU check
# offline"): makes a bundle (scripts/gpu-bundle.sh), then runs its run script in a
# mount namespace where the system's Open MPI, PMIx, HDF5, fmt, spdlog, xxhash,
# hwloc, libevent, GoogleTest, nlohmann-json and CLI11 (libraries, headers,
# CMake files, launchers and wrappers) are empty files and folders, as on the
# GPU machine. Asserts from the run's JSON summary and log:
#   - every bundled binary and library loads (the ldd step), the bundled
#     mpirun starts 2 ranks, and no program misses a shared library;
#   - the Python extension builds from the bundle for this machine's Python
#     (python/.venv's) and imports;
#   - the C++ GPU tests, the torch GPU tests and the stall benchmark report
#     skipped (no device here), none failed;
#   - controls: inside the namespace, gpu_test without the bundle's library
#     path misses libmpi or libhdf5, and the system's mpirun does not run.
# Exits 77 (skipped) when not root, without unshare, without a CUDA toolkit or
# without python/.venv (python/setup_venv.sh).
#
#
#   tests/gpu_bundle_test.sh                  # the bundle of the GPU machine:
#       # build-gpu-bundle/, its binaries built in a Release tree of their own
#       # (ctest gpu_bundle.release; ~10 min with a cold compiler cache)
#   tests/gpu_bundle_test.sh --binaries TREE  # TREE's binaries (a build tree
#       # with CUDA, built already), bundled into TREE/gpu-bundle/ (ctest
#       # gpu_bundle.namespace, in the default suite: ~3 min, most of it the
#       # extension's build inside the namespace)
#
# Environment: MHCKPT_BUNDLE_REUSE=1 keeps an existing bundle;
# MHCKPT_BUNDLE_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$SECONDS
py=${MHCKPT_BUNDLE_TEST_PYTHON:-$repo/python/.venv/bin/python}
bundle=$repo/build-gpu-bundle work=$repo/build-gpubundle-work
if [ "${1:-}" = --binaries ]; then
  tree=$(realpath "$2")
  export MHCKPT_BUNDLE_BINARIES=$tree
  bundle=$tree/gpu-bundle work=$tree/gpu-bundle-work
fi
export MHCKPT_BUNDLE_DIR=$bundle MHCKPT_BUNDLE_TEST_WORK=$work

if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
  echo "SKIPPED: needs root and unshare (a mount namespace)"
  exit 77
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "SKIPPED: no CUDA toolkit to build the bundle against"
  exit 77
fi
if ! "$py" -c 'import nanobind, scikit_build_core, pytest, mpi4py' 2>/dev/null; then
  echo "SKIPPED: $py lacks nanobind, scikit-build-core, pytest or mpi4py (python/setup_venv.sh)"
  exit 77
fi

export MHCKPT_BUNDLE_JOBS=${MHCKPT_BUNDLE_JOBS:-2}
if [ "${MHCKPT_BUNDLE_REUSE:-0}" != 1 ] || [ ! -x "$bundle/run" ]; then
  scripts/gpu-bundle.sh
fi
echo "== bundle ready after $((SECONDS - start)) s"

tmp=$(mktemp -d /tmp/mhckpt-gpu-bundle-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/empty" "$tmp/out"
: >"$tmp/empty-file"

# What the GPU machine lacks, hidden: folders under empty folders, each
# regular file (not a link: a bind mount follows it) under an empty file.
L=/usr/lib/x86_64-linux-gnu
hide_dirs=()
for d in "$L"/openmpi "$L"/pmix2 "$L"/hdf5 /usr/share/openmpi /etc/openmpi /usr/include/hdf5 \
  /usr/include/fmt /usr/include/spdlog /usr/include/nlohmann /usr/include/CLI /usr/include/gtest \
  /usr/include/gmock /usr/include/x86_64-linux-gnu/openmpi /usr/include/x86_64-linux-gnu/mpi \
  "$L"/cmake/fmt "$L"/cmake/spdlog "$L"/cmake/GTest /usr/share/cmake/nlohmann_json \
  /usr/share/cmake/CLI11; do
  [ -d "$d" ] && hide_dirs+=("$(realpath "$d")")
done
mapfile -t hide_files < <(
  find "$L" -maxdepth 1 -type f \( -name 'libmpi*' -o -name 'libopen-pal*' -o -name 'libopen-rte*' \
    -o -name 'libmca_common*' -o -name 'liboshmem*' -o -name 'libompitrace*' -o -name 'libhdf5*' \
    -o -name 'libsz.*' -o -name 'libaec*' -o -name 'libfmt*' -o -name 'libspdlog*' \
    -o -name 'libxxhash*' -o -name 'libhwloc*' -o -name 'libevent*' -o -name 'libpmix*' \
    -o -name 'libgtest*' -o -name 'libgmock*' -o -name 'libmunge*' \)
  find /usr/include -maxdepth 1 -type f -name 'xx*.h'
  for b in orterun orted opal_wrapper h5pcc h5pcc.openmpi mpicc.openmpi mpicxx.openmpi mpirun.openmpi; do
    [ -e "/usr/bin/$b" ] && realpath "/usr/bin/$b"
  done | sort -u
)
echo "== hiding ${#hide_dirs[@]} folders and ${#hide_files[@]} files in a mount namespace"

cat >"$tmp/inside.sh" <<'EOF'
set -uo pipefail
tmp=$1 repo=$2 py=$3
shift 3
mount --make-rprivate /
while [ $# -gt 0 ]; do
  # A folder inside one hidden before is gone already.
  [ -e "$1" ] || { shift; continue; }
  if [ -d "$1" ]; then mount --bind "$tmp/empty" "$1"; else mount --bind "$tmp/empty-file" "$1"; fi
  shift
done
cd "$repo"
# The control: without the bundle, the test binary misses libmpi.
# (An empty library file stops ldd at once: "file too short".)
seen=$(ldd "$MHCKPT_BUNDLE_DIR/bin/gpu_test" 2>&1)
if ! grep -Eq 'lib(mpi|hdf5_openmpi)\.so.* (=> not found|file too short)' <<<"$seen"; then
  echo "CONTROL FAILED: gpu_test still finds libmpi outside the bundle"
  echo "$seen"
  exit 3
fi
echo "control: outside the bundle gpu_test misses its MPI and HDF5 libraries"
if command -v mpirun >/dev/null && mpirun --version >/dev/null 2>&1; then
  echo "CONTROL FAILED: the system's mpirun still runs"
  exit 3
fi
echo "control: the system's mpirun does not run"
# The scratch folder inside the repository (git-ignored): ccache's base
# directory then makes the extension's compiles hits from one run to the next.
export MHCKPT_BUNDLE_PYTHON=$py OUT=$tmp/out MHCKPT_BUNDLE_WORK=$MHCKPT_BUNDLE_TEST_WORK
export MHCKPT_BUNDLE_REPO=$repo
export MHCKPT_BUNDLE_EXTENSION_LIMIT=${MHCKPT_BUNDLE_EXTENSION_LIMIT:-1200}
if [ -z "${MHCKPT_BUNDLE_CMAKE_ARGS:-}" ] && command -v ccache >/dev/null; then
  export MHCKPT_BUNDLE_CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
fi
"$MHCKPT_BUNDLE_DIR/run"
EOF
set +e
unshare -m bash "$tmp/inside.sh" "$tmp" "$repo" "$py" "${hide_dirs[@]}" "${hide_files[@]}"
rc=$?
set -e
echo "== the run script exited $rc after $((SECONDS - start)) s"
[ "$rc" = 3 ] && exit 1

"$py" - "$tmp/out/gpu-bundle.json" "$tmp/out/gpu-bundle.log" <<'EOF'
import json, re, sys
summary = json.load(open(sys.argv[1]))
log = open(sys.argv[2]).read()
steps = {s["name"]: s for s in summary["steps"]}
errors = []
def expect(name, allowed):
    s = steps.get(name)
    if s is None:
        errors.append(f"{name}: missing from the summary")
    elif s["status"] not in allowed:
        errors.append(f"{name}: {s['status']} ({s['note']}), expected {' or '.join(allowed)}")
for name in ("env", "ldd", "mpirun", "mpi4py", "extension"):
    expect(name, ("passed",))
for name in steps:
    if re.match(r"^(gpu\.|torch\.|jax\.|stall\.)", name):
        expect(name, ("skipped",))
for name in ("donation.np2", "save_restore.np2"):
    expect(name, ("passed", "skipped"))
for pattern in ("error while loading shared libraries", "cannot open shared object file",
                "not found (required by"):
    if pattern in log:
        errors.append(f"the log says: {pattern}")
for s in summary["steps"]:
    print(f"{s['name']:28} {s['status']:8} {s['seconds']:4} s  {s['note']}")
print(f"total {summary['total_seconds']} s")
if errors:
    print("FAILED:\n  " + "\n  ".join(errors))
    sys.exit(1)
print("gpu_bundle: every binary loads; GPU tests skipped for want of a device; extension built")
EOF
echo "== gpu_bundle test done in $((SECONDS - start)) s"
