#!/usr/bin/env bash
# clang-format (check only) and clang-tidy (.clang-tidy) over the sources.
# Needs a configured build/ (scripts/bootstrap.sh) for compile_commands.json.
# Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files '*.h' '*.cc' | xargs clang-format --dry-run -Werror
out=$(git ls-files '*.cc' | grep -E '^(base|worker|io|coordinator|cli|demo)/' |
      xargs clang-tidy --quiet -p build 2>&1 || true)
# The Python extension is configured by `pip install .` (python/setup_venv.sh)
# into build-python/<wheel tag>/; checked when that build exists.
pydb=$(ls -d build-python/*/ 2>/dev/null | head -1 || true)
if [ -n "$pydb" ] && [ -f "$pydb/compile_commands.json" ]; then
  out+=$'\n'$(git ls-files 'python/src/*.cc' | xargs clang-tidy --quiet -p "$pydb" 2>&1 || true)
fi
findings=$(grep -E ': (warning|error):' <<<"$out" || true)
if [ -n "$findings" ]; then
  echo "$findings"
  exit 1
fi
echo "lint: clean"
