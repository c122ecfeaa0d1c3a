#!/usr/bin/env bash
# Prefix-aware routing benchmark (not a test). Run after scripts/build.sh.
#
#   scripts/bench-routing.sh [REQUESTS] [CONCURRENCY] [OUTPUT_LEN] [PREFILL_KV_BLOCKS]
#
# 2 prefill workers + 1 decode worker, stories15M-shaped model (context
# stretched to 2048), prefix caches on. The load: 8 shared system prompts of
# 384 tokens, each request one of them plus its own 64-token suffix
# (tandem-bench --dataset shared_prefix), REQUESTS (default 200) of them,
# CONCURRENCY (default 8) in flight, OUTPUT_LEN (default 16) tokens each.
# Run once with the router's --routing_policy=prefix and once with
# --routing_policy=load, each on a fresh cluster (cold caches). Prints per
# policy: the prefill workers' prefix-cache hit rate (hit / queried tokens,
# from their /metrics), the share of prompt tokens served from cache (the
# router's request log: cached_tokens / prompt_tokens), how the requests
# split over the two prefill workers, and TTFT p50 / p99.
set -euo pipefail
requests="${1:-200}"
concurrency="${2:-8}"
output_len="${3:-16}"
# Each prefill worker's KV pool: 160 blocks of 16 tokens hold the blocks of
# the requests in flight (a shared prompt's blocks are not copied) and about
# 6 of the 8 system prompts (24 blocks each). A worker that sees all 8 keeps
# evicting them; one that sees half of them keeps them all. With room for
# every prompt on every worker, both policies hit alike.
prefill_kv_blocks="${4:-160}"
source "$(dirname "$0")/bench-common.sh" 23000

# prefill_hit_rate: the prefill workers' own counters, summed over both.
prefill_hit_rate() {
  python3 - "$port" <<'PY'
import sys, urllib.request
port = int(sys.argv[1])
hit = queried = 0.0
for i in range(2):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port + 1100 + i}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith("tandem_prefill_prefix_cache_hit_tokens_total"):
            hit += float(line.split()[-1])
        elif line.startswith("tandem_prefill_prefix_cache_queried_tokens_total"):
            queried += float(line.split()[-1])
print("%.1f%%" % (100 * hit / queried) if queried else "n/a")
PY
}

# from_log: cached share of prompt tokens and the split over prefill workers.
from_log() {
  python3 - "$work/cluster/requests.jsonl" <<'PY'
import collections, json, sys
rs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = [r for r in rs if r.get("status") == "ok"]
prompt = sum(r.get("prompt_tokens", 0) for r in ok)
cached = sum(r.get("cached_tokens", 0) for r in ok)
split = collections.Counter(r.get("prefill_worker") or "local" for r in ok)
print("%.1f%%" % (100 * cached / prompt if prompt else 0),
      "/".join(str(n) for _, n in sorted(split.items())), len(rs) - len(ok))
PY
}

printf "%-7s %15s %15s %13s %7s %10s %10s\n" policy "prefill hits" "cached tokens" \
  "prefill split" failed "TTFT p50" "TTFT p99"
for policy in prefix load; do
  cluster_up --prefill 2 --decode 1 --router_args "--routing_policy=$policy" \
    --prefill_args "--kv_blocks=$prefill_kv_blocks"
  : >"$work/cluster/requests.jsonl"
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --dataset shared_prefix \
    --num_prefixes 8 --prefix_len 384 --input_len 64 --range_ratio 0 --vocab_size 32000 \
    --output_len "$output_len" --max_concurrency "$concurrency" --num_requests "$requests" \
    --seed 7 --progress=false --result_json "$work/r.json" >/dev/null
  hits=$(prefill_hit_rate)
  read -r cached split failed < <(from_log)
  read -r p50 p99 < <(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["ttft_ms"]
print("%.2f %.2f" % (t["median"], t["p99"]))' "$work/r.json")
  printf "%-7s %15s %15s %13s %7s %7s ms %7s ms\n" "$policy" "$hits" "$cached" "$split" \
    "$failed" "$p50" "$p99"
  cluster_down
done
