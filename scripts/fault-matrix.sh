#!/usr/bin/env bash
# The fault matrix (tests/e2e/netlab_fault_test.cc): {SIGKILL, SIGSTOP for
# 10 s, 5% packet loss, 50 ms added delay, a 10 s partition, a restart} x
# {a prefill worker, a decode worker, the router}, each cell a cluster of a
# router, 2 prefill and 2 decode workers in network namespaces of their own,
# under a load of at least REQUESTS requests (8 clients). Prints the table.
# Needs root, `ip netns` and /dev/net/tun (exits 77 without them), and a
# build (scripts/build.sh). About 15 s a cell.
#
#   scripts/fault-matrix.sh [REQUESTS] [GTEST_FILTER]
#
# REQUESTS defaults to 1000; GTEST_FILTER (e.g. '*Decode') runs some cells.
set -euo pipefail
requests="${1:-1000}"
filter="${2:-*}"
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BUILD:-$root/build}/bin/netlab_fault_test"
if [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1 || [ ! -w /dev/net/tun ]; then
  echo "SKIP: the fault matrix needs root, 'ip netns' (iproute2) and /dev/net/tun" >&2
  exit 77
fi
if [ ! -x "$bin" ]; then
  echo "no $bin: build it first (ninja -C build netlab_fault_test)" >&2
  exit 1
fi
table="$(mktemp)"
trap 'rm -f "$table"' EXIT
status=0
NETLAB_REQUESTS="$requests" NETLAB_TABLE="$table" "$bin" --gtest_filter="Matrix/*.Cell/$filter" \
  >&2 || status=$?
echo
echo "Fault matrix: $requests+ requests a cell, 8 clients, 30 s deadline, greedy 12 tokens."
echo "| cell | requests | OK | failed (code) | attempts retried (code) | wrong tokens |" \
  "p50 | p99 | max latency | max extra latency of requests started during the fault |" \
  "idle after | recovery |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
cat "$table"
exit "$status"
