#!/usr/bin/env bash
# Makes build-gpu-bundle/ (git-ignored, <= 48 MiB): the GPU check for a bare,
# offline GPU machine that has CUDA 13 (driver, nvcc, cudart), Python 3.12 with
# torch, jax, mpi4py, nanobind, scikit-build-core and the nvidia-nccl-cu13
# wheel, but no Open MPI, parallel HDF5, fmt, spdlog, xxhash, GoogleTest,
# nlohmann-json or CLI11 (docs/TESTING.md, "The GPU check offline").
#
#   scripts/gpu-bundle.sh        # builds into build-gpubundle-tree/, then the bundle
#
# The bundle holds:
#   bin/        gpu_test, donation_test, save_restore_test (GoogleTest linked
#               statically) and mhckpt-gpu-stall, built here with CUDA (-DMHCKPT_WITH_CUDA=ON
#               is an error without the toolkit), stripped;
#   sys/usr/    a copy of this machine's Debian layout of what the GPU machine
#               lacks: Open MPI 4.1 (mpirun, orted, the wrappers, its MCA
#               plugins and help files; relocated with OPAL_PREFIX), PMIx
#               (PMIX_INSTALL_PREFIX), parallel HDF5, fmt, spdlog, xxhash,
#               hwloc, libevent, with the CMake files that the Python
#               extension's build needs there;
#   headers.tar.gz  their headers (nlohmann-json and CLI11 too: configure-time
#               only), unpacked into sys/ by the run script;
#   fallback/   every other library a binary needs that is not glibc,
#               libstdc++/libgcc, the CUDA driver or NCCL (libcurl and its
#               TLS/Kerberos stack that HDF5 links, zlib, libudev, ...):
#               the run script puts it on LD_LIBRARY_PATH after the machine's
#               own library directories, so the machine's copy wins where it has one;
#   run         scripts/gpu-bundle-run.sh (what it runs and reports: its header).
# Left out on purpose: glibc, libstdc++ and libgcc_s (the machine's are newer
# than Debian 12's, which this is built against); libcuda (the driver's);
# libnccl (the nvidia-nccl-cu13 wheel's, found by the run script: a second
# NCCL beside torch's would break torch, and it is 200+ MB); libcudart (linked
# statically, MHCKPT_CUDART_STATIC).
#
# Environment: MHCKPT_BUNDLE_TREE (build tree, default build-gpubundle-tree),
# MHCKPT_BUNDLE_JOBS (default 2), MHCKPT_BUNDLE_MAX_MIB (default 48),
# MHCKPT_BUNDLE_DIR (where the bundle goes, default build-gpu-bundle),
# MHCKPT_BUNDLE_BINARIES (a build tree configured with CUDA whose binaries are
# built already: they are bundled as they are, nothing is configured or built;
# the test suite's quick form of the check uses its own tree so).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$SECONDS
tree=${MHCKPT_BUNDLE_TREE:-build-gpubundle-tree}
B=${MHCKPT_BUNDLE_DIR:-$repo/build-gpu-bundle}
jobs=${MHCKPT_BUNDLE_JOBS:-2}
max_mib=${MHCKPT_BUNDLE_MAX_MIB:-48}
arch=x86_64-linux-gnu
L=/usr/lib/$arch

# 1. The binaries, against CUDA 13 (an error if the toolkit is missing).
targets=(gpu_test donation_test save_restore_test mhckpt_gpu_stall)
if [ -n "${MHCKPT_BUNDLE_BINARIES:-}" ]; then
  tree=$MHCKPT_BUNDLE_BINARIES
  for t in gpu_test donation_test save_restore_test mhckpt-gpu-stall; do
    [ -x "$tree/bin/$t" ] || { echo "gpu-bundle: no $tree/bin/$t (a tree built with CUDA?)" >&2; exit 1; }
  done
else
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  gen=()
  command -v ninja >/dev/null && [ ! -f "$tree/CMakeCache.txt" ] && gen=(-G Ninja)
  mkdir -p "$tree"
  cmake -S . -B "$tree" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DMHCKPT_WITH_CUDA=ON \
    -DMHCKPT_BUILD_BENCH=ON "${launcher[@]}" >"$tree/configure.log" 2>&1 ||
    { cat "$tree/configure.log"; exit 1; }
  cmake --build "$tree" -j "$jobs" --target "${targets[@]}"
fi
built=$((SECONDS - start))

rm -rf "$B"
mkdir -p "$B/bin" "$B/sys" "$B/fallback"
for t in gpu_test donation_test save_restore_test mhckpt-gpu-stall; do
  cp "$tree/bin/$t" "$B/bin/"
done
strip --strip-unneeded "$B"/bin/*

# Copy a file of this machine into sys/ at its own path, with the chain of
# symbolic links that leads to it (libfoo.so -> libfoo.so.1 -> libfoo.so.1.2).
copy_sys() {
  local p=$1
  p=${p/#\/lib\//\/usr\/lib\/}  # usrmerge: /lib is /usr/lib
  while :; do
    [ -e "$B/sys$p" ] || [ -L "$B/sys$p" ] && return 0
    mkdir -p "$B/sys$(dirname "$p")"
    if [ -L "$p" ]; then
      local to
      to=$(readlink "$p")
      cp -P "$p" "$B/sys$p"
      case $to in /*) p=$to ;; *) p=$(realpath -sm "$(dirname "$p")/$to") ;; esac
      [ -d "$p" ] && return 0  # a link to a directory: copy_tree copies that
    else
      cp -p "$p" "$B/sys$p"
      return 0
    fi
  done
}
copy_tree() { # a directory, as it is (help files, headers, CMake files), no Fortran modules
  mkdir -p "$B/sys$1"
  tar -C "$1" --exclude='*.mod' -cf - . | tar -C "$B/sys$1" -xf -
}

# 2. Open MPI: the launcher, the wrappers, the help files, the plugins that need
# nothing the GPU machine lacks beyond what is bundled (no UCX, libfabric,
# verbs, PSM, OpenSHMEM: single-node runs use the shared-memory and TCP
# transports), the libraries' development links and headers.
ompi=$L/openmpi
for f in /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper; do copy_sys "$f"; done
mkdir -p "$B/sys/usr/bin"
for w in mpirun mpiexec; do ln -sf orterun "$B/sys/usr/bin/$w"; done
for w in mpicc mpicxx mpic++; do ln -sf opal_wrapper "$B/sys/usr/bin/$w"; done
copy_tree /usr/share/openmpi
unwanted='libuc[pstm]|libpsm|libfabric|libibverbs|librdmacm|libnl-|libefa|libinfinipath|liboshmem|libmca_common_(ucx|verbs|ofi)'
plugins=()
for f in "$ompi"/lib/openmpi3/*.so; do
  # (ldd's output read whole: grep -q exiting early would fail the pipe.)
  grep -Eq "$unwanted" <<<"$(ldd "$f")" && continue
  copy_sys "$f"
  plugins+=("$f")
done
for f in "$ompi"/lib/lib{mpi,mpi_cxx,open-pal,open-rte,mca_common_sm,mca_common_ompio,mca_common_monitoring}.so; do
  copy_sys "$f"
done
mkdir -p "$B/sys$ompi"
# The public headers and the C++ bindings' (mpi.h includes them), not the
# internal ones of opal, orte and oshmem, nor Fortran modules.
(cd "$ompi" && find include -maxdepth 1 -type f ! -name '*.mod' && find include/openmpi/ompi/mpi/cxx) |
  tar -C "$ompi" --no-recursion -cf - -T - | tar -C "$B/sys$ompi" -xf -
# PMIx (Open MPI's runtime links libpmix; PMIx loads its own plugins and help files).
pmix=$L/pmix2
for f in "$pmix"/lib/pmix/*.so; do
  grep -Eq "$unwanted" <<<"$(ldd "$f")" && continue
  copy_sys "$f"
  plugins+=("$f")
done
[ -d "$pmix/share" ] && copy_tree "$pmix/share"

# 3. Parallel HDF5, fmt, spdlog, xxhash: libraries, development links, headers,
# CMake files; nlohmann-json and CLI11 (headers only, for CMake's configure).
for f in "$L"/hdf5/openmpi/{include,lib,libhdf5.so,libhdf5.settings} "$L"/libhdf5_openmpi.so \
  "$L"/libfmt.so "$L"/libspdlog.so "$L"/libxxhash.so; do
  copy_sys "$f"
done
for d in /usr/include/hdf5/openmpi /usr/include/fmt /usr/include/spdlog /usr/include/nlohmann \
  /usr/include/CLI "$L"/cmake/fmt "$L"/cmake/spdlog /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11; do
  copy_tree "$d"
done
cp -p /usr/include/xxhash.h "$B/sys/usr/include/"
[ -f /usr/include/xxh3.h ] && cp -p /usr/include/xxh3.h "$B/sys/usr/include/"
[ -f /usr/include/xxh_x86dispatch.h ] && cp -p /usr/include/xxh_x86dispatch.h "$B/sys/usr/include/"
for f in "$L"/pkgconfig/{fmt,spdlog,libxxhash}.pc; do [ -e "$f" ] && copy_sys "$f"; done

# 4. Every library the binaries, the launcher and the plugins load (ldd: the
# whole closure): what the GPU machine certainly lacks into sys/, the rest into
# fallback/, nothing of glibc, libstdc++, the CUDA driver or NCCL.
provided='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libnccl)'
core='^lib(mpi|open-pal|open-rte|mca_common|hwloc|event|pmix|munge|hdf5|sz\.|aec|fmt|spdlog|xxhash)'
for f in "$B"/bin/* /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper "${plugins[@]}" \
  "$L"/libhdf5_openmpi.so; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $provided ]] && continue
  if [[ $name =~ $core ]]; then
    copy_sys "$path"
  else
    cp -pL "$path" "$B/fallback/$name"
  fi
done
find "$B/sys" "$B/fallback" -type f -name '*.so*' -exec strip --strip-unneeded {} +
strip --strip-unneeded "$B/sys/usr/bin/orterun" "$B/sys/usr/bin/orted" "$B/sys/usr/bin/opal_wrapper"

# 5. The headers, needed only by the extension's build there, go into one
# gzip tarball (7 MiB of text in about 1.5): the run script unpacks it.
headers=(usr/include "usr/lib/$arch/openmpi/include")
tar -C "$B/sys" -czf "$B/headers.tar.gz" "${headers[@]}"
for h in "${headers[@]}"; do rm -rf "${B:?}/sys/$h"; done

# 6. The run script and what was put where.
cp scripts/gpu-bundle-run.sh "$B/run"
chmod +x "$B/run"
bytes=$(du -sb "$B" | cut -f1)
{
  echo "built $(date -u +%FT%TZ) from commit $(git log -1 --format=%h 2>/dev/null || echo unknown)"
  echo "cuda $(grep -m1 '^CUDAToolkit_VERSION' "$tree"/CMakeCache.txt 2>/dev/null | cut -d= -f2 || true)"
  echo "build ${built} s, bundle $((SECONDS - start)) s, ${bytes} bytes"
  (cd "$B" && find . -type f | sort)
} >"$B/MANIFEST"
mib=$(((bytes + 1048575) / 1048576))
echo "gpu-bundle: $B: $mib MiB ($bytes bytes), built in ${built} s, bundled in $((SECONDS - start)) s"
if [ "$mib" -gt "$max_mib" ]; then
  echo "gpu-bundle: larger than $max_mib MiB" >&2
  exit 1
fi
