#!/usr/bin/env bash
# What a decode worker's drain costs the clients, with the K/V handoff and
# without it (recomputed): runs cluster_fault_test's two drain cases in
# turn, ROUNDS times (default 3), and prints one table row per run from the
# figures the test prints. Needs a build (scripts/build.sh).
#
#   scripts/bench-drain.sh [ROUNDS]
set -euo pipefail
rounds="${1:-3}"
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BUILD:-$root/build}/bin/cluster_fault_test"
if [ ! -x "$bin" ]; then
  echo "no $bin: build it first (scripts/build.sh)" >&2
  exit 1
fi
# absl's durations ("55.4ms", "4.7s") in whole milliseconds.
ms() {
  awk -v d="$1" 'BEGIN {
    n = d + 0
    if (d ~ /ms$/) printf "%.0f ms", n
    else if (d ~ /us$|µs$/) printf "%.1f ms", n / 1000
    else printf "%.0f ms", n * 1000
  }'
}
declare -A filter=(
  [handoff]='ClusterFaultTest.DecodeWorkerDrainedMidStreamItsStreamsMoveElsewhere'
  [recompute]='ClusterFaultTest.DecodeWorkerDrainedWithoutKvHandoffItsStreamsAreRecomputed'
)
echo "| round | moved by | client pause, median | client pause, max | worker exit after SIGTERM | streams done after SIGTERM |"
echo "|---:|---|---:|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for how in handoff recompute; do
    out="$("$bin" --gtest_filter="${filter[$how]}" 2>&1)" || {
      echo "$how, round $round: the test failed:" >&2
      echo "$out" | tail -40 >&2
      exit 1
    }
    pause="$(echo "$out" | grep -m1 'longest pause per gRPC stream')"
    median="$(echo "$pause" | sed -E 's/.*median ([^,]+), max.*/\1/')"
    max="$(echo "$pause" | sed -E 's/.*, max ([^;]+);.*/\1/')"
    done_after="$(echo "$pause" | sed -E 's/.*streams done ([^ ]+) after.*/\1/')"
    exited="$(echo "$out" | grep -m1 'drained worker exited' | sed -E 's/.*exited ([^ ]+) after.*/\1/')"
    echo "| $round | $how | $(ms "$median") | $(ms "$max") | $(ms "$exited") | $(ms "$done_after") |"
  done
done
