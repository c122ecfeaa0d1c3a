#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite.
# Tests that need ../shared/models skip when it is missing, unless
# TANDEM_REQUIRE_MODELS=1 (as in CI), which makes them fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
ctest --preset release "$@"
