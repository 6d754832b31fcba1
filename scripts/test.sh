#!/usr/bin/env bash
# Bootstraps and builds, then runs the default test suite (every label but
# slurm and gpu-only ones; GPU tests skip without a device). Extra arguments go to ctest,
# e.g. scripts/test.sh -L unit   or   scripts/test.sh -R reshard
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 300 "$@"
