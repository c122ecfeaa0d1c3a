#!/usr/bin/env bash
# Interference between prefill and decode (a benchmark, not a test). Run
# after scripts/build.sh, on an otherwise idle machine.
#
#   scripts/bench-interference.sh [PROMPTS] [RATE]
#
# 16 streams decode 256 tokens each (32 requests, 16 at a time) while
# PROMPTS requests with 1,024-token prompts arrive at RATE per second
# (Poisson), stories15M-shaped model (context 2048). Three layouts:
#   - colocated, prefill-first: a waiting prompt is computed whole before
#     the decodes continue (--schedule_policy=prefill_first), 2 threads;
#   - colocated, chunked prefill: prompts are cut into chunks that share
#     each step's budget of 256 tokens with the decodes
#     (--schedule_policy=chunked --prefill_chunk_tokens=256), 2 threads;
#   - disaggregated: one prefill worker on CPU 0 and one decode worker on
#     CPU 1, 1 thread each; prefill steps of at most 512 tokens.
# Prints TPOT p50/p99 and the inter-token latency p99 of the decoding
# streams (a prompt computed in the decode worker's step shows as one long
# gap), and TTFT p50/p99 of the long prompts.
set -euo pipefail
prompts="${1:-10}"
rate="${2:-1}"
source "$(dirname "$0")/bench-common.sh" 23000

summary() {  # summary FILE METRIC -> "p50 p99"
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))[sys.argv[2]]; print("%.1f %.1f" % (m["median"], m["p99"]))' "$1" "$2"
}

run() {  # run LABEL CLUSTER_ARGS...
  local label=$1
  shift
  cluster_up "$@"
  local common=(--target "grpc://127.0.0.1:$port" --dataset synthetic --range_ratio 0
    --vocab_size 32000 --progress=false)
  "$bin/tandem-bench" "${common[@]}" --input_len 32 --output_len 256 --max_concurrency 16 \
    --num_requests 32 --seed 1 --result_json "$work/decode.json" >/dev/null &
  local decoders=$!
  sleep 1  # the decodes are running when the prompts start arriving
  "$bin/tandem-bench" "${common[@]}" --input_len 1024 --output_len 4 --request_rate "$rate" \
    --num_requests "$prompts" --seed 2 --result_json "$work/prompt.json" >/dev/null
  wait "$decoders"
  cluster_down
  read -r tpot50 tpot99 < <(summary "$work/decode.json" tpot_ms)
  read -r itl50 itl99 < <(summary "$work/decode.json" itl_ms)
  read -r ttft50 ttft99 < <(summary "$work/prompt.json" ttft_ms)
  printf "%-28s %9s %9s %9s %10s %10s\n" "$label" "$tpot50" "$tpot99" "$itl99" "$ttft50" \
    "$ttft99"
}

printf "%-28s %9s %9s %9s %10s %10s\n" layout "TPOT p50" "TPOT p99" "ITL p99" "TTFT p50" \
  "TTFT p99"
run "colocated, prefill-first" --prefill 0 --decode 1 --threads 2 \
  --decode_args "--schedule_policy=prefill_first"
run "colocated, chunked prefill" --prefill 0 --decode 1 --threads 2 \
  --decode_args "--schedule_policy=chunked --prefill_chunk_tokens=256"
# The prefill worker computes one prompt at a time, in steps of 512 tokens:
# on one core a step of 512 rows already runs the matmuls at full speed, and
# two 1,024-token prompts sharing a step would both wait for both.
run "disaggregated, 1 core each" --prefill 1 --decode 1 --threads 1 \
  --prefill_cpus 0 --decode_cpus 1 --prefill_args "--max_batch_tokens=512"
