#!/usr/bin/env bash
# Assembles the build context of Dockerfile.prebuilt from a build tree's
# binaries: CONTEXT/bin gets the binaries the images ship, CONTEXT/lib the
# shared libraries they link that no Debian package provides (found with ldd
# and dpkg; a CUDA build tree brings the CUDA runtime and cuBLAS, about
# 600 MB), CONTEXT/runtime-packages.txt the Debian packages for the rest.
# Usage: prebuilt-context.sh BIN_DIR CONTEXT_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BIN_DIR CONTEXT_DIR" >&2; exit 2; }
bin=$1 ctx=$2
here="$(cd "$(dirname "$0")" && pwd)"
binaries=(tandem-router tandem-prefill tandem-decode tandem-cli tandem-generate tandem-convert
  tandem-bench tandem-synth)

mkdir -p "$ctx/bin" "$ctx/lib"
cp "$here/runtime-packages.txt" "$ctx/"
for b in "${binaries[@]}"; do
  [ -x "$bin/$b" ] || { echo "prebuilt-context: $bin/$b is missing; build it first" >&2; exit 1; }
  ln -f "$bin/$b" "$ctx/bin/" 2>/dev/null || cp "$bin/$b" "$ctx/bin/"
done

# Every library the binaries resolve to, by its real file.
declare -A real_of
while read -r soname arrow path _; do
  [ "$arrow" = "=>" ] || continue
  if [ "$path" = "not" ]; then
    echo "prebuilt-context: $soname is not found on this host (ldd $bin)" >&2
    exit 1
  fi
  real_of[$soname]=$(readlink -f "$path")
done < <(for b in "${binaries[@]}"; do ldd "$bin/$b"; done)
# dpkg knows files by the paths packages ship them under (/lib or /usr/lib on
# a merged /usr), so ask by file name; it fails when some name has no owner.
patterns=()
for soname in "${!real_of[@]}"; do patterns+=("*/$(basename "${real_of[$soname]}")"); done
owned=$({ dpkg-query -S "${patterns[@]}" 2>/dev/null || true; } | sed 's/^[^:]*:[^ ]* //' |
  xargs -rn1 basename | sort -u)
for soname in "${!real_of[@]}"; do
  real=${real_of[$soname]}
  grep -qxF "$(basename "$real")" <<<"$owned" && continue
  ln -f "$real" "$ctx/lib/$soname" 2>/dev/null || cp "$real" "$ctx/lib/$soname"
  echo "prebuilt-context: bundling $real as lib/$soname (no Debian package has it)" >&2
done
