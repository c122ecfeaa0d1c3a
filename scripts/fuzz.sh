#!/usr/bin/env bash
# Runs a libFuzzer target of tests/fuzz for a while:
#   scripts/fuzz.sh TARGET SECONDS   one target (gguf, chat_template, ...)
#   scripts/fuzz.sh all SECONDS      every target, two at a time ($FUZZ_JOBS)
#   scripts/fuzz.sh list             the target names
# Builds the `fuzz` preset (clang 14, ASan + UBSan + libFuzzer, build-fuzz/)
# first, holding the build lock ($TANDEM_BUILD_LOCK, default
# /tmp/tandem-build.lock) so that it never overlaps another build. Each run
# starts from a scratch copy of tests/fuzz/corpus/TARGET (the repository is
# not modified) with the target's dictionary when it has one, prints the
# executions, exec/s and coverage, and exits nonzero when an input crashed,
# leaked, hung or failed a FUZZ_CHECK. The crashing input is kept under
# build-fuzz/fuzz-artifacts/TARGET/: reproduce it with
# build-fuzz/bin/fuzz_TARGET FILE, and once fixed save it under
# tests/fuzz/regressions/TARGET/ so that the fuzz_regressions ctest keeps it.
# Extra arguments after SECONDS go to libFuzzer (e.g. -seed=1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() {
  echo "usage: scripts/fuzz.sh TARGET|all SECONDS [libFuzzer flags...] | scripts/fuzz.sh list" >&2
  exit 2
}

targets=()
for dir in tests/fuzz/corpus/*/; do targets+=("$(basename "$dir")"); done

[[ $# -ge 1 ]] || usage
if [[ $1 == list ]]; then
  printf '%s\n' "${targets[@]}"
  exit 0
fi
[[ $# -ge 2 && $2 =~ ^[0-9]+$ && $2 -gt 0 ]] || usage
what=$1
seconds=$2
shift 2
if [[ $what == all ]]; then
  run=("${targets[@]}")
else
  [[ -d tests/fuzz/corpus/$what ]] || {
    echo "fuzz.sh: no target '$what' (targets: ${targets[*]})" >&2
    exit 2
  }
  run=("$what")
fi

# Longest input per target: a few times the largest seed, small enough that
# one execution stays fast.
max_len() {
  case $1 in
    kv_message_header) echo 128 ;;
    ucx_hello) echo 512 ;;
    kv_lease) echo 2048 ;;
    openai_request) echo 4096 ;;
    chat_template | safetensors) echo 8192 ;;
    *) echo 16384 ;;
  esac
}

lock=${TANDEM_BUILD_LOCK:-/tmp/tandem-build.lock}
build_targets=()
for t in "${run[@]}"; do build_targets+=("fuzz_$t"); done
werror=OFF
if [[ ${TANDEM_WERROR:-0} == 1 ]]; then werror=ON; fi
flock "$lock" bash -c '
  set -e
  werror=$1
  shift
  cmake --preset fuzz -DTANDEM_WERROR="$werror" >/dev/null
  ninja -C build-fuzz -j2 "$@"
' fuzz-build "$werror" "${build_targets[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

scratch=$(mktemp -d /tmp/tandem-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# One target's run: its summary line goes to $scratch/$t.line, ending in
# " ok" or in what crashed.
fuzz_one() {
  local t=$1
  shift
  local corpus=$scratch/$t
  mkdir -p "$corpus"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  local artifacts=$root/build-fuzz/fuzz-artifacts/$t
  mkdir -p "$artifacts"
  # -entropic=0: with the thousands of features a template or tokenizer
  # input touches, the entropic schedule's bookkeeping took half the time;
  # without it chat_template runs 3.6 times as many inputs and reaches more
  # coverage in the same time.
  local flags=(-max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10
               -max_len="$(max_len "$t")" -entropic=0 -print_final_stats=1
               -artifact_prefix="$artifacts/")
  if [[ -f tests/fuzz/dict/$t.dict ]]; then flags+=(-dict="tests/fuzz/dict/$t.dict"); fi
  local log=$scratch/$t.log
  echo "=== fuzz_$t for ${seconds}s (log: build-fuzz/fuzz-artifacts/$t/last.log)"
  local status=0
  build-fuzz/bin/fuzz_"$t" "${flags[@]}" "$@" "$corpus" >"$log" 2>&1 || status=$?
  cp "$log" "$artifacts/last.log"
  local runs rate cov ft line crash
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  line=$(printf '%-20s runs %-10s exec/s %-7s cov %-6s ft %-6s' "$t" "${runs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}")
  if [[ $status -ne 0 ]]; then
    crash=$(grep -o "Test unit written to .*" "$log" | tail -1 | sed 's/Test unit written to //')
    line+=" CRASH (exit $status) ${crash:-see the log}"
    grep -E 'ERROR: |FUZZ_CHECK|runtime error|SUMMARY' "$log" | head -5 >&2 || true
  else
    line+=" ok"
  fi
  echo "$line"
  echo "$line" >"$scratch/$t.line"
}

# Targets run FUZZ_JOBS at a time (default 2, one a core: each libFuzzer
# run is single-threaded), so that `all` takes SECONDS for every two
# targets, not for every one.
jobs=${FUZZ_JOBS:-2}
running=0
for t in "${run[@]}"; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" "$@" &
  running=$((running + 1))
done
wait || true

failed=()
summary=()
for t in "${run[@]}"; do
  line=$(cat "$scratch/$t.line" 2>/dev/null || echo "$t: no result")
  summary+=("$line")
  [[ $line == *" ok" ]] || failed+=("$t")
done

echo "=== fuzz.sh summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if ((${#failed[@]} > 0)); then
  echo "fuzz.sh: crashes in: ${failed[*]} (inputs under build-fuzz/fuzz-artifacts/)" >&2
  exit 1
fi
