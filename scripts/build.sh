#!/usr/bin/env bash
# Installs the dependencies and builds tandem (Release) into build/.
# Extra arguments go to the CMake configure step, e.g. -DTANDEM_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release "$@" >/dev/null
cmake --build --preset release
