#!/usr/bin/env bash
# Checks that every C++ and CUDA source of the tree is as clang-format-14
# (the repository's .clang-format) writes it; --fix rewrites them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format-14 >/dev/null || ./scripts/install-deps.sh
# Tracked and new files that exist (a deletion not yet staged is skipped).
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
  '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^tests/fuzz/corpus/' |
  while read -r f; do [ -f "$f" ] && echo "$f"; done)
if [ "${1:-}" = --fix ]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
if ! clang-format-14 --dry-run --Werror "${files[@]}" 2>/tmp/tandem-format.$$; then
  grep -E '^[^ ].*: (error|warning):' /tmp/tandem-format.$$ | cut -d: -f1 | sort -u |
    sed 's/^/not clang-format clean: /' >&2
  rm -f /tmp/tandem-format.$$
  echo "check-format: run ./scripts/check-format.sh --fix" >&2
  exit 1
fi
rm -f /tmp/tandem-format.$$
echo "check-format: ${#files[@]} files clean"
