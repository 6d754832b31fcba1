#!/usr/bin/env bash
# The GPU check on a bare, offline GPU machine: build-gpu-bundle/run, a copy of
# this file that scripts/gpu-bundle.sh puts into the bundle (docs/TESTING.md,
# "The GPU check offline"). From the repository root there:
#
#   build-gpu-bundle/run            # writes $OUT/gpu-bundle.log and $OUT/gpu-bundle.json
#
# Steps, each with its own time limit, each recorded as passed, failed or
# skipped with its seconds:
#   env        the machine: nvidia-smi, Python, torch, jax, the CUDA runtime and NCCL used;
#   ldd        every bundled binary and library loads (no "not found");
#   mpirun     the bundled mpirun starts 2 ranks;
#   mpi4py     the machine's mpi4py runs at 2 ranks on the bundled Open MPI;
#   extension  the Python extension built for the machine's Python, from the
#              bundle's headers and libraries (pip install --no-build-isolation
#              --target; 16 jobs), and imported;
#   gpu.*      the C++ GPU tests at 1 and 2 ranks (as tests/CMakeLists.txt runs
#              them: gpu, gpu.contexts, the 2 -> 3 reshard), donation and
#              save_restore at 2 ranks; exit 77 or "[  SKIPPED ]" is skipped;
#   torch.*    python/tests/test_torch_cuda.py at 1 and 2 ranks;
#   jax.*      python/tests/test_jax_gpu.py at 1 and 2 ranks (2: saved at 2, restored at 1);
#   stall.*    mhckpt-gpu-stall, 1 GiB at 1 and 2 ranks (its JSON lines in the log).
# Exits 0 when nothing failed. Without a GPU the GPU steps report skipped.
#
# Environment: OUT (default build-gpu-bundle/out), MHCKPT_BUNDLE_PYTHON (default
# python3), MHCKPT_BUNDLE_WORK (scratch, default /tmp/mhckpt-gpu-bundle),
# MHCKPT_BUNDLE_JOBS (default: nproc), MHCKPT_BUNDLE_CMAKE_ARGS (more for the
# extension's CMake, e.g. a compiler launcher), MHCKPT_BUNDLE_EXTENSION_LIMIT
# (seconds, default 240), MHCKPT_BUNDLE_SKIP (a regular expression
# of steps to leave out, e.g. '^(torch|jax)\.'), MHCKPT_BUNDLE_REPO (the source
# tree, default the bundle's parent folder).
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
REPO=${MHCKPT_BUNDLE_REPO:-$(dirname "$B")}
# The headers travel packed (scripts/gpu-bundle.sh): unpacked once, in place.
if [ -f "$B/headers.tar.gz" ] && [ ! -d "$B/sys/usr/include" ]; then
  tar -C "$B/sys" -xzf "$B/headers.tar.gz" || { echo "run: cannot unpack $B/headers.tar.gz" >&2; exit 1; }
fi
OUT=${OUT:-$B/out}
WORK=${MHCKPT_BUNDLE_WORK:-/tmp/mhckpt-gpu-bundle}
PY=${MHCKPT_BUNDLE_PYTHON:-python3}
JOBS=${MHCKPT_BUNDLE_JOBS:-$(nproc)}
SKIP=${MHCKPT_BUNDLE_SKIP:-}
mkdir -p "$OUT"
rm -rf "$WORK"
mkdir -p "$WORK"
LOG=$OUT/gpu-bundle.log
RESULTS=$WORK/results.tsv
: >"$LOG"
: >"$RESULTS"
exec > >(tee -a "$LOG") 2>&1
t0=$SECONDS

S=$B/sys/usr
L=$S/lib/x86_64-linux-gnu
export OPAL_PREFIX=$S PMIX_PREFIX=$L/pmix2 PMIX_MCA_mca_base_component_path=$L/pmix2/lib/pmix
export PATH=$S/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Single node: shared memory and TCP; no /etc/openmpi of the machine's own.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_hwloc_base_binding_policy=none

# The machine's NCCL and CUDA runtime: the Python wheels' first
# (nvidia-nccl-cu13; nvidia-cuda-runtime, torch's own, so that torch and jax
# load what their wheels would), then the toolkit's; the bundle's fallback/
# comes last, after the machine's own library folders.
cuda_dirs=()
site=$("$PY" -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
for s in $site; do
  for lib in "$s"/nvidia/*/lib/libnccl.so.2 "$s"/nvidia/*/lib/libcudart.so.13; do
    [ -e "$lib" ] && cuda_dirs+=("$(dirname "$lib")")
  done
done
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcudart.so.13" ] && cuda_dirs+=("$d")
done
ld=$L:$L/hdf5/openmpi
for d in "${cuda_dirs[@]}"; do ld+=:$d; done
ld+=:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu:/usr/local/nvidia/lib64:/usr/local/nvidia/lib:$B/fallback
export LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MHCKPT_TEST_DIR=$WORK/testdata
mkdir -p "$MHCKPT_TEST_DIR"

# step NAME SECONDS COMMAND...: runs COMMAND with a time limit; exit 0 passed,
# 77 skipped, anything else failed (124: timed out). A step whose output says
# "[  SKIPPED ]" (a GoogleTest skip) or "skipped: " with exit 0 is skipped.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "$SKIP" ] && [[ $name =~ $SKIP ]]; then
    printf '%s\tskipped\t0\tleft out (MHCKPT_BUNDLE_SKIP)\n' "$name" >>"$RESULTS"
    return 0
  fi
  echo "== $name ($(date -u +%T), limit ${limit} s): $*"
  local s=$SECONDS out=$WORK/step.out rc status note=""
  # A child bash, for the functions below (exported); timeout signals its
  # whole process group, mpirun's ranks included.
  timeout -k 5 "$limit" bash -c '"$@"' step "$@" >"$out" 2>&1
  rc=$?
  cat "$out"
  if [ $rc = 0 ]; then
    status=passed
    if grep -q '\[  SKIPPED \]' "$out" || grep -qi '^skipped: ' "$out"; then
      status=skipped
      note=$(grep -m1 -i 'skipped' "$out" | tr '\t' ' ' | cut -c1-200)
    fi
  elif [ $rc = 77 ]; then
    status=skipped
    note=$(grep -m1 -i 'skip' "$out" | tr '\t' ' ' | cut -c1-200)
  else
    status=failed
    note="exit $rc"
    [ $rc = 124 ] && note="timed out after ${limit} s"
    [ $rc = 5 ] && note="exit 5 (pytest: no tests collected)"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - s))" "$note" >>"$RESULTS"
  echo "== $name: $status in $((SECONDS - s)) s${note:+ ($note)}"
}

env_step() {
  echo "bundle: $(head -n 3 "$B/MANIFEST" | tr '\n' ';')"
  uname -a
  if command -v nvidia-smi >/dev/null && nvidia-smi -L; then
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  else
    echo "no GPU (nvidia-smi missing or found no device)"
  fi
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  "$PY" -c 'import sys; print("python", sys.version)'
  for m in torch jax mpi4py nanobind scikit_build_core numpy; do
    "$PY" -c "import $m; print('$m', getattr($m, '__version__', '?'))" 2>&1 | tail -n 1
  done
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "CUDA runtime and NCCL directories: ${cuda_dirs_list:-none}"
}

ldd_step() {
  local bad=0 f n=0
  while IFS= read -r f; do
    n=$((n + 1))
    if ldd "$f" 2>&1 | grep -E 'not found' | grep -v 'libnccl\.so\.2\|libcuda\.so\.1' >"$WORK/ldd.out"; then
      echo "$f:"
      cat "$WORK/ldd.out"
      bad=1
    fi
    # libnccl and libcuda come from the machine: a GPU machine must have them.
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 &&
      ldd "$f" 2>&1 | grep -E '(libnccl\.so\.2|libcuda\.so\.1) => not found'; then
      echo "$f: the machine's NCCL or CUDA driver was not found"
      bad=1
    fi
  done < <(find "$B/bin" "$S/bin" "$L" "$B/fallback" -type f \( -name '*.so*' -o -perm -u+x \) \
    ! -name '*.txt' ! -name '*.h' ! -name '*.cmake' ! -name '*.pc' ! -name '*.settings' \
    -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print)
  echo "checked $n ELF files"
  return $bad
}

extension_step() {
  # scikit-build-core through pip, as a user installs it; the bundle's prefix
  # for CMake's find_package, the build directory outside the repository.
  # (CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses the old policy ranges of
  # some packages' CMake files; earlier CMake ignores it.)
  export CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$S -DHDF5_ROOT=$L/hdf5/openmpi -DMPI_HOME=$S \
-DCMAKE_POLICY_VERSION_MINIMUM=3.5 ${MHCKPT_BUNDLE_CMAKE_ARGS:-}"
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS SKBUILD_BUILD_DIR=$WORK/build-python
  "$PY" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir -q \
    --target "$WORK/site" "$REPO" || return 1
  (cd / && PYTHONPATH=$WORK/site "$PY" -c \
    'import mhckpt, mhckpt._core as c; print("mhckpt", mhckpt.__version__, "from", c.__file__)')
}

mpi() { # NP PROGRAM ARGS...
  local np=$1
  shift
  mpirun --oversubscribe --bind-to none -np "$np" "$@"
}
pytest_gpu() { # NP FILE
  local np=$1 file=$REPO/$2
  if [ ! -f "$file" ]; then
    echo "skipped: $2 does not exist yet"
    return 77
  fi
  # From the scratch folder: the installed package, not the sources, is imported.
  (cd "$WORK" && PYTHONPATH=$WORK/site mpi "$np" "$PY" -m pytest -p no:cacheprovider \
    --color=no -q -rs --rootdir "$REPO" -o faulthandler_timeout=120 "$file") | tee "$WORK/pytest.out"
  local rc=${PIPESTATUS[0]}
  [ $rc = 5 ] && return 77
  # Every test skipped (no device): pytest's summary names no passed, failed or error.
  local summary
  summary=$(grep -E '^[0-9]+ (passed|failed|skipped|error)' "$WORK/pytest.out" | tail -n 1)
  if [ $rc = 0 ] && [[ $summary =~ skipped ]] && ! [[ $summary =~ passed|failed|error ]]; then
    echo "skipped: every test of $2 ($summary)"
    return 77
  fi
  return $rc
}
stall() { # NP
  mpi "$1" "$B/bin/mhckpt-gpu-stall" 1024 "$WORK/stall$1"
}
export B REPO WORK PY JOBS S L
export cuda_dirs_list="${cuda_dirs[*]:-}"
export -f env_step ldd_step extension_step mpi pytest_gpu stall

step env 60 env_step
step ldd 60 ldd_step
step mpirun 30 mpi 2 uname -n
step mpi4py 60 mpi 2 "$PY" -c 'from mpi4py import MPI; c = MPI.COMM_WORLD
print(c.rank, c.size, MPI.Get_library_version().splitlines()[0])'
step extension "${MHCKPT_BUNDLE_EXTENSION_LIMIT:-240}" extension_step
bin=$B/bin
gpu=--gtest_filter=-GpuReshard.*:GpuContexts.*
step gpu.np1 120 mpi 1 "$bin/gpu_test" "$gpu"
step gpu.np2 120 mpi 2 "$bin/gpu_test" "$gpu"
step gpu.contexts.np1 60 env MHCKPT_GPU_CONTEXTS=1 bash -c 'mpi 1 "$0" --gtest_filter=GpuContexts.*' \
  "$bin/gpu_test"
step gpu.reshard.save.np2 60 env MHCKPT_GPU_PHASE=save bash -c 'mpi 2 "$0" --gtest_filter=GpuReshard.*' \
  "$bin/gpu_test"
step gpu.reshard.restore.np3 60 env MHCKPT_GPU_PHASE=restore \
  bash -c 'mpi 3 "$0" --gtest_filter=GpuReshard.*' "$bin/gpu_test"
step donation.np2 120 mpi 2 "$bin/donation_test"
step save_restore.np2 120 mpi 2 "$bin/save_restore_test"
step torch.np1 180 pytest_gpu 1 python/tests/test_torch_cuda.py
step torch.np2 180 pytest_gpu 2 python/tests/test_torch_cuda.py
step jax.np1 180 pytest_gpu 1 python/tests/test_jax_gpu.py
step jax.np2 180 pytest_gpu 2 python/tests/test_jax_gpu.py
step stall.np1 120 stall 1
step stall.np2 120 stall 2

total=$((SECONDS - t0))
"$PY" - "$RESULTS" "$OUT/gpu-bundle.json" "$total" <<'EOF'
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
steps = [{"name": r[0], "status": r[1], "seconds": int(r[2]), "note": r[3] if len(r) > 3 else ""}
         for r in rows]
count = {s: sum(1 for t in steps if t["status"] == s) for s in ("passed", "failed", "skipped")}
json.dump({"total_seconds": int(sys.argv[3]), **count, "steps": steps}, open(sys.argv[2], "w"), indent=1)
print(json.dumps(count), "in", sys.argv[3], "s")
EOF
! grep -q $'\tfailed\t' "$RESULTS"
