#!/usr/bin/env bash
# Builds the router and worker tests with AddressSanitizer and
# UndefinedBehaviorSanitizer (the asan preset: Debug, build-asan/) and runs
# them; a memory error, a leak or undefined behaviour fails the run.
# Arguments go to every test binary, e.g. --gtest_filter='*Limits*'.
# TANDEM_SANITIZE_TESTS overrides the list of test binaries. CUDA is off:
# ASan and the CUDA runtime do not mix.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a tests <<<"${TANDEM_SANITIZE_TESTS:-router_test router_http_server_test http_server_test \
router_limits_test router_metrics_test prefill_worker_test decode_worker_test kvtransfer_test}"

# The top CMakeLists builds UB checks without recovery: UB fails a test.
cmake --preset asan -DTANDEM_WITH_CUDA=OFF >/dev/null
cmake --build --preset asan --target "${tests[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

failed=()
for t in "${tests[@]}"; do
  bin=build-asan/bin/$t
  if [[ ! -x "$bin" ]]; then
    echo "sanitize.sh: no binary $bin" >&2
    failed+=("$t")
    continue
  fi
  echo "=== $bin"
  if ! "$bin" "$@"; then failed+=("$t"); fi
done
if ((${#failed[@]} > 0)); then
  echo "sanitize.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "sanitize.sh: all ${#tests[@]} test binaries passed under ASan/UBSan"
