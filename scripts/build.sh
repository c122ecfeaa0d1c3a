#!/usr/bin/env bash
# Installs the dependencies and builds tandem (Release) into build/: every
# target, or only those $TANDEM_BUILD_TARGETS names (space-separated; the
# demo builds just what it runs). Extra arguments go to the CMake configure
# step, e.g. -DTANDEM_WITH_CUDA=OFF.
#
# The CUDA backend builds wherever nvcc is found, unless
# TANDEM_CUDA_IF_GPU=1 (the demo) and no GPU is visible: then it is left
# out, as nothing would run it. TANDEM_WERROR=1 (CI) makes every compiler
# warning an error.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# -U first: a tree the demo configured without CUDA gets it back here, and
# an explicit -DTANDEM_WITH_CUDA among the arguments still wins.
cuda=(-UTANDEM_WITH_CUDA)
if [[ ${TANDEM_CUDA_IF_GPU:-0} == 1 ]] && ! nvidia-smi -L >/dev/null 2>&1; then
  cuda=(-DTANDEM_WITH_CUDA=OFF)
fi
werror=OFF
if [[ ${TANDEM_WERROR:-0} == 1 ]]; then werror=ON; fi
cmake --preset release "${cuda[@]}" -DTANDEM_WERROR="$werror" "$@" >/dev/null
targets=()
for t in ${TANDEM_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build --preset release ${targets[@]+"${targets[@]}"}
