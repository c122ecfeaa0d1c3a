#!/usr/bin/env bash
# Builds the concurrency-heavy test suites with ThreadSanitizer (the tsan
# preset: RelWithDebInfo, build-tsan/, CUDA off) and runs them; any data
# race, lock-order inversion or other TSan report fails the run.
# Arguments go to every test binary, e.g. --gtest_filter='*Cancel*'.
# TANDEM_TSAN_TESTS overrides the list of test binaries.
#
# Left out by default: tests that serve or call gRPC (router_test,
# router_limits_test, the *Service* tests). gRPC's C++ call objects are
# header code built into our binaries but handed between threads inside
# Debian's uninstrumented libgrpc, and TSan reports them; naming them
# (TANDEM_TSAN_TESTS, --gtest_filter) runs them anyway.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a tests <<<"${TANDEM_TSAN_TESTS:-kvtransfer_test ucx_transport_test ucx_churn_test \
decode_worker_test prefill_worker_test router_http_server_test}"
args=("$@")
((${#args[@]} > 0)) || args=(--gtest_filter='-*Service*:*Grpc*')

cmake --preset tsan >/dev/null
cmake --build --preset tsan --target "${tests[@]}"

# halt_on_error: the first report fails the test binary (exitcode 66);
# second_deadlock_stack: lock-order reports show where both locks were taken.
# The suppressions cover Debian's uninstrumented gRPC only (the file says why).
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:exitcode=66:\
suppressions=$PWD/scripts/tsan-suppressions.txt}"
# UCX's memory hooks patch mmap/malloc under TSan's own interceptors and
# crash at the first UCX context; they only keep UCX's registration cache
# in step with unmapped memory, which these tests do not need.
export UCX_MEM_EVENTS=no
# OpenBLAS and libgomp are not instrumented: their worker threads hand data
# to ours through synchronisation TSan cannot see. One thread keeps all the
# CPU math on the calling thread (the tests use tiny models). The CPU backend
# names its team size in each parallel region, so OMP_NUM_THREADS alone is
# not enough: OMP_THREAD_LIMIT caps every team.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_THREAD_LIMIT=1

failed=()
for t in "${tests[@]}"; do
  bin=build-tsan/bin/$t
  if [[ ! -x "$bin" ]]; then
    echo "tsan.sh: no binary $bin" >&2
    failed+=("$t")
    continue
  fi
  echo "=== $bin"
  start=$SECONDS
  if ! "$bin" "${args[@]}"; then failed+=("$t"); fi
  echo "=== $t: $((SECONDS - start)) s"
done
if ((${#failed[@]} > 0)); then
  echo "tsan.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "tsan.sh: all ${#tests[@]} test binaries passed under ThreadSanitizer"
