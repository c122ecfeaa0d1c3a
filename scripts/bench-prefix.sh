#!/usr/bin/env bash
# Prefix caching benchmarks (not tests). Run after scripts/build.sh.
#
#   scripts/bench-prefix.sh ttft [REQUESTS]
#     TTFT of a 512-token prompt whose first 0, 25, 50 or 90% is a prefix the
#     workers have seen (one warm-up request first), stories15M-shaped
#     model (context stretched to 2048),
#     one request at a time; disaggregated (1 prefill + 1 decode) and
#     colocated (decode only), each worker on one thread. Prints TTFT p50
#     and its ratio to the uncached case with the caches off (the 0% and 90%
#     shares run with the caches off too, as controls).
#   scripts/bench-prefix.sh chat [CONVERSATIONS] [TURNS]
#     Multi-turn chat through /v1/chat/completions: each turn sends the whole
#     history plus a new user message. Prints the KV bytes the prefill
#     worker shipped per turn (from the router's request log), with the
#     decode worker's prefix cache on and off.
#   scripts/bench-prefix.sh tier [REQUESTS]
#     TTFT of 512-token prompts whose 448-token prefix (one of 4, taken in
#     turn) the prefill worker computed before: with a pool that holds all
#     four, with a pool of 48 blocks that evicts each before it comes back
#     (recomputed), and the same pool over an SSD KV tier, a host-memory
#     tier, and a host tier too small for them over the SSD (loaded back);
#     then prompts that share nothing, with and without the tiers (their
#     cost when they cannot help). TTFT from the router's request log, after one
#     warm-up request per prefix.
set -euo pipefail
mode="${1:-ttft}"
source "$(dirname "$0")/bench-common.sh" 22000

up() {  # up PREFILL_WORKERS EXTRA_ARGS...
  local n=$1
  shift
  cluster_up --prefill "$n" --decode 1 "$@"
}
down() { cluster_down; }

ttft_p50() {  # ttft_p50 SHARE_PERCENT REQUESTS -> TTFT p50 in ms
  local share=$1 requests=$2 prefix=$((512 * $1 / 100))
  local data=(--dataset synthetic --input_len 512)
  [ "$prefix" -eq 0 ] || data=(--dataset shared_prefix --num_prefixes 1 --prefix_len "$prefix"
    --input_len $((512 - prefix)))
  # One request warms the prefix; then the measured ones.
  for n in 1 "$requests"; do
    "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" "${data[@]}" --range_ratio 0 \
      --output_len 2 --vocab_size 32000 --max_concurrency 1 --num_requests "$n" --seed 7 \
      --progress=false --result_json "$work/r.json" >/dev/null
  done
  python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["ttft_ms"]["median"])' \
    "$work/r.json"
}

if [ "$mode" = ttft ]; then
  requests="${2:-20}"
  printf "%-14s %-13s %-12s %10s %8s\n" layout "cached share" "prefix cache" "TTFT p50" "ratio"
  for layout in disaggregated colocated; do
    n=1
    [ "$layout" = colocated ] && n=0
    base=""
    for cache in off on; do
      args=()
      [ "$cache" = on ] || args=(--prefill_args "--noprefix_cache" --decode_args "--noprefix_cache")
      up "$n" ${args[@]+"${args[@]}"}
      shares="0 25 50 90"
      [ "$cache" = on ] || shares="0 90"
      for share in $shares; do
        t=$(ttft_p50 "$share" "$requests")
        [ -n "$base" ] || base=$t
        printf "%-14s %12s%% %-12s %8s ms %8s\n" "$layout" "$share" "$cache" "$t" \
          "$(python3 -c "print('%.2fx' % ($t / $base))")"
      done
      down
    done
  done
elif [ "$mode" = chat ]; then
  conversations="${2:-3}"
  turns="${3:-20}"
  for cache in on off; do
    args=()
    [ "$cache" = on ] || args=(--decode_args "--noprefix_cache")
    up 1 ${args[@]+"${args[@]}"}
    : >"$work/cluster/requests.jsonl"
    python3 "$root/scripts/chat_turns.py" "http://127.0.0.1:$((port + 1))" "$conversations" \
      "$turns"
    python3 - "$work/cluster/requests.jsonl" "$cache" "$turns" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
turns = int(sys.argv[3])
by_turn = {}
for i, r in enumerate(lines):
    by_turn.setdefault(i % turns, []).append(r)
print(f"decode prefix cache {sys.argv[2]}:")
print(f"{'turn':>4} {'prompt tokens':>13} {'held by decode':>14} {'KV bytes shipped':>16}")
for t in sorted(by_turn):
    rs = by_turn[t]
    avg = lambda k: sum(r.get(k, 0) for r in rs) / len(rs)
    print(f"{t + 1:>4} {avg('prompt_tokens'):>13.0f} {avg('decode_held_tokens'):>14.0f} "
          f"{avg('kv_bytes'):>16.0f}")
print(f"total KV bytes shipped: {sum(r.get('kv_bytes', 0) for r in lines)}")
PY
    down
  done
elif [ "$mode" = tier ]; then
  requests="${2:-24}"
  printf "%-34s %10s %10s %12s %10s\n" case "TTFT p50" "TTFT p90" "cached/req" "from tier"
  run_case() {  # run_case NAME DATASET PREFILL_ARGS
    local name=$1 dataset=$2 prefill_args=$3 data
    up 1 --prefill_args "$prefill_args"
    data=(--dataset synthetic --input_len 512)
    [ "$dataset" = synthetic ] || data=(--dataset shared_prefix --num_prefixes 4 --prefix_len 448
      --input_len 64)
    : >"$work/cluster/requests.jsonl"
    "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" "${data[@]}" --range_ratio 0 \
      --output_len 2 --vocab_size 32000 --max_concurrency 1 --num_requests $((requests + 4)) \
      --seed 7 --progress=false --result_json "$work/r.json" >/dev/null
    python3 - "$work/cluster/requests.jsonl" "$name" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][4:]
ttft = sorted(r["timeline_us"]["first_token"] / 1000 for r in lines)
p = lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))]
mean = lambda k: statistics.mean(r.get(k, 0) for r in lines)
print(f"{sys.argv[2]:<34} {statistics.median(ttft):>7.1f} ms {p(0.9):>7.1f} ms "
      f"{mean('cached_tokens'):>12.0f} {mean('tier_cached_tokens'):>10.0f}")
PY
    down
  }
  run_case "prefixes in the pool" shared "--kv_blocks=256"
  run_case "prefixes evicted, no tier" shared "--kv_blocks=48"
  rm -rf "$work/tier"
  run_case "prefixes evicted, SSD tier" shared "--kv_blocks=48 --kv_tier_dir=$work/tier --kv_tier_gib=1"
  run_case "prefixes evicted, host tier" shared "--kv_blocks=48 --kv_host_tier_gib=1"
  # Host memory for about 32 blocks (221 KB each) over the SSD: a prefix
  # (28 blocks) has gone on down by the time it comes back.
  rm -rf "$work/tier"
  run_case "prefixes evicted, small host + SSD" shared \
    "--kv_blocks=48 --kv_host_tier_gib=0.0066 --kv_tier_dir=$work/tier --kv_tier_gib=1"
  run_case "no reuse, no tier" synthetic "--kv_blocks=48"
  rm -rf "$work/tier"
  run_case "no reuse, SSD tier" synthetic "--kv_blocks=48 --kv_tier_dir=$work/tier --kv_tier_gib=1"
  run_case "no reuse, host tier" synthetic "--kv_blocks=48 --kv_host_tier_gib=1"
else
  echo "usage: $0 ttft [REQUESTS] | chat [CONVERSATIONS] [TURNS] | tier [REQUESTS]" >&2
  exit 2
fi
