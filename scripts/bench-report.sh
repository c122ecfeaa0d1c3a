#!/usr/bin/env bash
# One command for a serving report: builds tandem, starts a local cluster
# (deploy/local/cluster.sh: 2 prefill + 2 decode workers, stories260K or a
# synthetic model), runs tandem-bench at three request rates against it, and
# writes bench-report.html (charts) and bench-result.json beside the current
# folder's results/. Extra arguments go to tandem-bench, e.g.
#   ./scripts/bench-report.sh --sweep 5,20,60 --duration 20
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh"
port="${TANDEM_PORT:-8100}"
out="${TANDEM_BENCH_OUT:-$PWD/results}"
mkdir -p "$out"
export TANDEM_CLUSTER_DIR="${TANDEM_CLUSTER_DIR:-/tmp/tandem-bench-cluster}"
"$root/deploy/local/cluster.sh" up --port "$port"
trap '"$root/deploy/local/cluster.sh" down' EXIT
"$root/build/bin/tandem-bench" --target "grpc://127.0.0.1:$port" --sweep 10,40,80 \
  --duration 10 --input_len 128 --output_len 64 --range_ratio 0.25 \
  --slo ttft=200,tpot=20 --result_json "$out/bench-result.json" \
  --report_html "$out/bench-report.html" "$@"
echo "report: $out/bench-report.html, results: $out/bench-result.json" >&2
