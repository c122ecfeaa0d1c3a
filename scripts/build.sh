#!/usr/bin/env bash
# Installs the dependencies and builds tandem (Release) into build/: every
# target, or only those $TANDEM_BUILD_TARGETS names (space-separated; the
# demo builds just what it runs). Extra arguments go to the CMake configure
# step, e.g. -DTANDEM_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release "$@" >/dev/null
targets=()
for t in ${TANDEM_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build --preset release ${targets[@]+"${targets[@]}"}
