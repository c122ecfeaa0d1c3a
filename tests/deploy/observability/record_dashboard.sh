#!/usr/bin/env bash
# Records a short run of a local cluster for the dashboard's picture in
# docs/operations.md: deploy/local/cluster.sh up (2 prefill and 2 decode
# workers), a Prometheus (Debian's `prometheus` package) scraping every
# process each 2 s, tandem-bench sending shared-prefix prompts at 3, then
# 10, then 3 requests a second, 40 s each; then dashboard_svg.py record
# keeps the results of six panels' queries and render draws them.
# Usage: record_dashboard.sh RUN.json SVG [TTFT_SLO TPOT_SLO]   (seconds)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: record_dashboard.sh RUN.json SVG [TTFT_SLO TPOT_SLO]"; exit 2; }
run="$1" svg="$2" ttft="${3:-0.05}" tpot="${4:-0.004}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
command -v prometheus >/dev/null || { echo "prometheus is not installed (apt-get install prometheus)"; exit 1; }
tmp=$(mktemp -d)
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$tmp/cluster"
port=$((26000 + $$ % 50 * 20))
prom_port=$((port + 1500))
prom=""
cleanup() {
  [ -z "$prom" ] || kill "$prom" 2>/dev/null || true
  "$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

"$root/deploy/local/cluster.sh" up --port "$port" --prefill 2 --decode 2
{
  echo "global: {scrape_interval: 2s, evaluation_interval: 2s}"
  echo "scrape_configs:"
  echo "  - job_name: tandem"
  echo "    static_configs:"
  echo "      - {targets: ['127.0.0.1:$((port + 1000))'], labels: {pod: router}}"
  for i in 0 1; do
    echo "      - {targets: ['127.0.0.1:$((port + 1100 + i))'], labels: {pod: prefill-$i}}"
    echo "      - {targets: ['127.0.0.1:$((port + 1200 + i))'], labels: {pod: decode-$i}}"
  done
} >"$tmp/prometheus.yml"
prometheus --config.file "$tmp/prometheus.yml" --storage.tsdb.path "$tmp/tsdb" \
  --web.listen-address "127.0.0.1:$prom_port" >"$tmp/prometheus.log" 2>&1 &
prom=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$prom_port/-/ready" >/dev/null && break
  sleep 0.2
done
start=$(date +%s)
sleep 10
for rate in 3 10 3; do
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --vocab_size 512 --dataset shared_prefix \
    --num_prefixes 4 --prefix_len 64 --input_len 32 --output_len 48 --range_ratio 0.5 \
    --request_rate "$rate" --duration 40 --seed "$rate" --progress=false >/dev/null
done
sleep 10
end=$(date +%s)
python3 "$here/dashboard_svg.py" record --prometheus "http://127.0.0.1:$prom_port" \
  --start "$start" --end "$end" --out "$run"
python3 "$here/dashboard_svg.py" render "$run" --out "$svg" --ttft_slo "$ttft" --tpot_slo "$tpot"
echo "recorded $((end - start)) s into $run and drew $svg"
