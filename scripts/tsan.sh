#!/usr/bin/env bash
# Builds the concurrency-heavy test suites with ThreadSanitizer (the tsan
# preset: RelWithDebInfo, build-tsan/, CUDA off) and runs them; any data
# race, lock-order inversion or other TSan report fails the run.
# Arguments go to every test binary, e.g. --gtest_filter='*Cancel*'.
# TANDEM_TSAN_TESTS overrides the list of test binaries.
#
# Debian's gRPC is not instrumented either: its C++ call objects are header
# code built into our binaries and handed between threads inside libgrpc.
# scripts/tsan-suppressions.txt names those hand-offs, and our code marks
# where its own state crosses them (common/rpc/tsan_handoff.h), so the
# suites that serve and call gRPC run in full.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a tests <<<"${TANDEM_TSAN_TESTS:-kvtransfer_test ucx_transport_test ucx_churn_test ucx_door_test \
decode_worker_test prefill_worker_test router_test router_limits_test router_http_server_test \
http_server_test}"
args=("$@")

werror=OFF
if [[ ${TANDEM_WERROR:-0} == 1 ]]; then werror=ON; fi
cmake --preset tsan -DTANDEM_WERROR="$werror" >/dev/null
cmake --build --preset tsan --target "${tests[@]}"

# halt_on_error: the first report fails the test binary (exitcode 66);
# second_deadlock_stack: lock-order reports show where both locks were taken;
# history_size: a longer memory of past accesses, so that a report's earlier
# access has its stack, which the suppressions are matched against.
# The suppressions cover Debian's uninstrumented gRPC and absl only (the
# file says why).
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:exitcode=66:history_size=4:\
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
# The absl lock annotations (common/base/tsan/absl_sync_annotations.cc) must
# come before absl in the loader's search, whatever order a binary's link
# line gave them.
export LD_PRELOAD="$PWD/build-tsan/libtandem_tsan_absl.so${LD_PRELOAD:+:$LD_PRELOAD}"

# Two binaries at a time (TSAN_JOBS): each is mostly one busy thread, so
# two keep both cores busy. Each one's output is printed whole when it ends.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run_one() {
  local t=$1 bin=build-tsan/bin/$1 start=$SECONDS status=0
  shift
  if [[ ! -x "$bin" ]]; then
    echo "tsan.sh: no binary $bin" >"$logs/$t.log"
    echo 1 >"$logs/$t.status"
    return
  fi
  "$bin" "$@" >"$logs/$t.log" 2>&1 || status=$?
  echo "=== $t: $((SECONDS - start)) s" >>"$logs/$t.log"
  echo "$status" >"$logs/$t.status"
}
jobs=${TSAN_JOBS:-2}
running=0
for t in "${tests[@]}"; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$t" ${args[@]+"${args[@]}"} &
  running=$((running + 1))
done
wait || true
failed=()
for t in "${tests[@]}"; do
  echo "=== build-tsan/bin/$t"
  cat "$logs/$t.log"
  [[ $(cat "$logs/$t.status" 2>/dev/null) == 0 ]] || failed+=("$t")
done
if ((${#failed[@]} > 0)); then
  # Each failure's cause again, last, where a log's tail shows it: the
  # tests that failed, the first sanitizer report, the binary's last lines.
  for t in "${failed[@]}"; do
    echo "=== tsan.sh: why $t failed (status $(cat "$logs/$t.status" 2>/dev/null))"
    grep -E '^\[  FAILED  \]|Failure$' "$logs/$t.log" | head -20 || true
    sed -n '/^WARNING: ThreadSanitizer/,/^SUMMARY: ThreadSanitizer/p' "$logs/$t.log" | head -80
    tail -n 25 "$logs/$t.log"
  done
  echo "tsan.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "tsan.sh: all ${#tests[@]} test binaries passed under ThreadSanitizer"
