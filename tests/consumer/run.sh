#!/usr/bin/env bash
# The installed package, as a user gets it: install the build into a fresh
# prefix, then build tests/consumer against it twice — with
# find_package(mhckpt) and with pkg-config — and run each under mpiexec; the
# installed `mhckpt` tool lists what they saved. (ctest: install.consumer)
#
#   run.sh BUILD_DIR WORK_DIR CXX MPICXX "MPIEXEC -n" [MPIEXEC FLAGS...]
set -euo pipefail
build=$1 work=$2 cxx=$3 mpicxx=$4 mpiexec_n=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
prefix=$work/prefix
rm -rf "$work" && mkdir -p "$work"

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in include/mhckpt/coordinator/checkpoint_manager.h bin/mhckpt lib*/cmake/mhckpt/mhckptConfig.cmake \
         lib*/cmake/mhckpt/mhckptConfigVersion.cmake lib*/pkgconfig/mhckpt.pc lib*/libmhckpt_base.a; do
  compgen -G "$prefix/$f" >/dev/null || { echo "not installed: $f"; exit 1; }
done

echo "== find_package(mhckpt): configure, build, run at 2 ranks"
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
$mpiexec_n 2 "$@" "$work/build/consumer" "$work/ckpt_cmake"
"$prefix/bin/mhckpt" list "$work/ckpt_cmake" | tee "$work/list.txt"
grep -q ', 1 committed' "$work/list.txt"

echo "== pkg-config mhckpt: build with $mpicxx, run at 3 ranks"
PKG_CONFIG_PATH=$(dirname "$(compgen -G "$prefix/lib*/pkgconfig/mhckpt.pc")")
export PKG_CONFIG_PATH
# shellcheck disable=SC2046  # pkg-config's output is a list of words
"$mpicxx" -std=c++20 -O1 "$here/consumer.cc" -o "$work/consumer_pc" $(pkg-config --cflags --libs mhckpt)
$mpiexec_n 3 "$@" "$work/consumer_pc" "$work/ckpt_pc"
echo "install.consumer: passed"
