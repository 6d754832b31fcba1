#!/usr/bin/env bash
# clang-format (check only) and clang-tidy (.clang-tidy) over the sources.
# Needs a configured build/ (scripts/bootstrap.sh) for compile_commands.json.
# Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files '*.h' '*.cc' | xargs clang-format --dry-run -Werror
out=$(git ls-files '*.cc' | grep -E '^(base|worker|io|coordinator|cli|demo)/' |
      xargs clang-tidy --quiet -p build 2>&1 || true)
findings=$(grep -E ': (warning|error):' <<<"$out" || true)
if [ -n "$findings" ]; then
  echo "$findings"
  exit 1
fi
echo "lint: clean"
