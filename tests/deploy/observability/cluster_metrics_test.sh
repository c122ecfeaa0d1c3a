#!/usr/bin/env bash
# The metric names of the Helm chart's dashboard and alert rules and of
# docs/operations.md, against what running processes serve: a local
# cluster (deploy/local/cluster.sh: a router, a prefill worker with a KV
# tier, a decode worker, on stories260K), a tandem-planner in advisory mode
# reading the router, and a prefill and a decode worker on a synthetic
# mixture of experts (the only model whose expert counters exist). One
# request goes through the cluster, then every process's /metrics is
# scraped, and metric_names.py check-cluster compares: the names and types
# served against those the C++ source registers, every name the dashboard,
# the rules' template and the page use, and the page's metrics reference
# (each served metric once, with its type and labels).
# Usage: cluster_metrics_test.sh BIN_DIR MODELS_DIR
set -uo pipefail
bin="$1"
models="${TANDEM_MODELS:-$2}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
tmp=$(mktemp -d)
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$tmp/cluster" TANDEM_MODELS="$models"
# Below the ephemeral range (32768+); metrics use port+1000..port+1200.
port=$((25000 + ($$ % 50) * 20))
pids=()
cleanup() {
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null; done
  for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null; done
  "$root/deploy/local/cluster.sh" down >/dev/null 2>&1
  if [ "${TANDEM_KEEP_TEST_DIRS:-}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/*.log "$tmp"/cluster/*.log; do [ -f "$f" ] && { echo "---- $f"; tail -n 15 "$f"; }; done
  exit 1
}
# wait_file FILE NAME: until a process has written its port file.
wait_file() {
  for _ in $(seq 1 300); do
    [ -s "$1" ] && return 0
    sleep 0.1
  done
  fail "$2 wrote no $1"
}

if [ ! -f "$models/stories260K.bin" ] || [ ! -f "$models/tok512.bin" ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from $models"; fi
  echo "SKIP: fixtures not found in $models"; exit 0
fi
for b in tandem-router tandem-prefill tandem-decode tandem-planner tandem-synth tandem-cli; do
  [ -x "$bin/$b" ] || fail "$bin/$b is missing: build it first"
done
start=$(date +%s.%N)

"$root/deploy/local/cluster.sh" up --port "$port" --prefill 1 --decode 1 \
  --prefill_args "--kv_tier_dir $tmp/tier --kv_tier_gib 0.25" 2>"$tmp/up.err" || fail "up: $(cat "$tmp/up.err")"

cat >"$tmp/plan.json" <<'JSON'
{"plans": [{"request_rate": 1, "chosen": 0, "points": [{"prefill": 1, "decode": 1}]}]}
JSON
"$bin/tandem-planner" --router_metrics "127.0.0.1:$((port + 1000))" --plan "$tmp/plan.json" \
  --interval 1s --mode advisory --metrics_listen 127.0.0.1:0 --metrics_port_file "$tmp/planner.mport" \
  >"$tmp/planner.log" 2>&1 &
pids+=($!)

# A mixture of experts, 4 experts of which each token takes 2, in 2 layers.
"$bin/tandem-synth" --output "$tmp/moe.gguf" --format gguf --shape olmoe-1b-7b --dim 64 --hidden_dim 32 \
  --expert_hidden 32 --n_layers 2 --n_heads 4 --n_kv_heads 4 --vocab_size 512 --seq_len 256 \
  --n_experts 4 --top_k 2 --tokenizer_output "$tmp/moe-tok.bin" >"$tmp/synth.log" 2>&1 ||
  fail "tandem-synth: $(cat "$tmp/synth.log")"
for role in prefill decode; do
  "$bin/tandem-$role" --model "$tmp/moe.gguf" --tokenizer "$tmp/moe-tok.bin" --threads 1 \
    --listen 127.0.0.1:0 --port_file "$tmp/moe-$role.port" \
    --metrics_listen 127.0.0.1:0 --metrics_port_file "$tmp/moe-$role.mport" >"$tmp/moe-$role.log" 2>&1 &
  pids+=($!)
done

"$bin/tandem-cli" generate --router "127.0.0.1:$port" --prompt "Once upon a time" --max-tokens 8 \
  >"$tmp/cli.out" 2>"$tmp/cli.err" || fail "tandem-cli: $(cat "$tmp/cli.err")"

wait_file "$tmp/planner.mport" tandem-planner
wait_file "$tmp/moe-prefill.mport" "the mixture-of-experts prefill worker"
wait_file "$tmp/moe-decode.mport" "the mixture-of-experts decode worker"
endpoints=("router:$((port + 1000))" "prefill:$((port + 1100))" "decode:$((port + 1200))"
  "planner:$(cat "$tmp/planner.mport")" "moe-prefill:$(cat "$tmp/moe-prefill.mport")"
  "moe-decode:$(cat "$tmp/moe-decode.mport")")
scrapes=()
for e in "${endpoints[@]}"; do
  name=${e%%:*}
  curl -sSf --max-time 5 "http://127.0.0.1:${e#*:}/metrics" >"$tmp/$name.metrics" ||
    fail "scraping $name on port ${e#*:} failed"
  grep -q '^tandem_' "$tmp/$name.metrics" || fail "$name serves no tandem_ series"
  scrapes+=("$tmp/$name.metrics")
done

python3 "$here/metric_names.py" source --root "$root" >"$tmp/source.json" || fail "reading the source failed"
python3 "$here/metric_names.py" check-cluster "$tmp/source.json" --scrapes "${scrapes[@]}" \
  --uses "$root/deploy/helm/tandem/dashboards/tandem.json" "$root/deploy/helm/tandem/templates/prometheusrule.yaml" \
  "$root/docs/operations.md" --docs "$root/docs/operations.md" >"$tmp/check.out" 2>&1
status=$?
cat "$tmp/check.out"
[ "$status" -eq 0 ] || fail "the metric names disagree (above)"
echo "PASS: $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$tmp/source.json") metrics" \
  "checked in $(python3 -c "import time; print(f'{time.time() - $start:.1f}')") s"
