#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite.
# Tests that need ../shared/models skip when it is missing, unless
# TANDEM_REQUIRE_MODELS=1 (as in CI), which makes them fail instead.
# Arguments go to ctest, e.g. -L e2e or -R cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
./scripts/build.sh
built=$SECONDS
echo "test.sh: dependencies and build took $((built - start)) s"
status=0
ctest --preset release "$@" || status=$?
echo "test.sh: ctest took $((SECONDS - built)) s"
exit "$status"
