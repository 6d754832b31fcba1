#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (a build directory of their own; the
# main build uses g++) and fuzzes the commit-marker parser (io::ParseMarker)
# under ASan and UBSan.
#
#   fuzz/run.sh [--strict] [--replay] [SECONDS] [extra libFuzzer flags...]
#
#   SECONDS    fuzzing time (-max_total_time), default 60
#   --replay   run every input of the corpora once and stop (no fuzzing)
#   --strict   tolerate nothing, even bugs listed as known and open
#
# Known bugs: while a reported library bug is open, list it in
# fuzz/known_bugs.supp (UBSan suppressions) or MHCKPT_FUZZ_KNOWN_BUGS
# (properties of marker_fuzzer.cc, e.g. "lossless"), so that fuzzing still
# finds new bugs; remove it once fixed. None is open now.
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), CLANG_CC / CLANG_CXX
# (default clang-14 / clang++-14), JOBS. Exits 77 (ctest's "skipped") when
# clang or its libFuzzer runtime is absent; a crash or a violated property
# exits 1 (libFuzzer's own default, 77, would read as "skipped").
#
# The seed corpus fuzz/corpus/marker/ is read, never written: new inputs go to
# FUZZ_BUILD_DIR/corpus/marker. A crash leaves crash-* in
# FUZZ_BUILD_DIR/artifacts/ and exits non-zero; add that input to
# fuzz/corpus/marker/ and report the bug.
set -euo pipefail
cd "$(dirname "$0")/.."

STRICT=0
REPLAY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --strict) STRICT=1; shift ;;
    --replay) REPLAY=1; shift ;;
    *) break ;;
  esac
done
SECONDS_TO_RUN=${1:-60}
[ $# -gt 0 ] && shift
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
CC_BIN=${CLANG_CC:-clang-14}
CXX_BIN=${CLANG_CXX:-clang++-14}

if ! command -v "$CXX_BIN" >/dev/null || ! command -v "$CC_BIN" >/dev/null; then
  echo "fuzz: $CXX_BIN not found; skipping (apt-get install clang-14 libclang-rt-14-dev)"
  exit 77
fi
# libFuzzer ships in libclang-rt-14-dev; probe that it links.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/p.cc"
if ! "$CXX_BIN" -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" 2>"$probe/err"; then
  echo "fuzz: $CXX_BIN cannot link -fsanitize=fuzzer; skipping:"
  cat "$probe/err"
  exit 77
fi

# Coverage and sanitizers on everything the fuzzer links (the io and base
# libraries, nlohmann::json); -fsanitize=fuzzer itself only on the target.
# UBSan checks stay recoverable so that suppressions work; halt_on_error below
# makes every unsuppressed report fatal.
FLAGS="-g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DMHCKPT_BUILD_FUZZ=ON -DMHCKPT_BUILD_TESTS=OFF \
  -DMHCKPT_WITH_CUDA=OFF -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target marker_fuzzer

mkdir -p "$BUILD/corpus/marker" "$BUILD/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1}
UBSAN="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
if [ "$STRICT" = 1 ]; then
  unset MHCKPT_FUZZ_KNOWN_BUGS
  echo "fuzz: strict: known bugs are not tolerated"
else
  UBSAN="$UBSAN:suppressions=$PWD/fuzz/known_bugs.supp"
  export MHCKPT_FUZZ_KNOWN_BUGS=${MHCKPT_FUZZ_KNOWN_BUGS-}
  echo "fuzz: known bugs tolerated: fuzz/known_bugs.supp, MHCKPT_FUZZ_KNOWN_BUGS='$MHCKPT_FUZZ_KNOWN_BUGS'"
fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-$UBSAN}

RUN=(-max_total_time="$SECONDS_TO_RUN")
[ "$REPLAY" = 1 ] && RUN=(-runs=0)
exec "$BUILD/bin/marker_fuzzer" "$BUILD/corpus/marker" fuzz/corpus/marker "${RUN[@]}" \
  -max_len=16384 -timeout=10 -rss_limit_mb=2048 -dict=fuzz/marker.dict \
  -error_exitcode=1 -timeout_exitcode=1 -artifact_prefix="$BUILD/artifacts/" \
  -print_final_stats=1 "$@"
