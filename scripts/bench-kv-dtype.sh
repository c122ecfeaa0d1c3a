#!/usr/bin/env bash
# KV bytes shipped per prompt and TTFT through a local cluster (1 router, 1
# prefill, 1 decode worker; KV over UCX), for each KV cache type in turn:
# bf16, then int8 (a byte per value with an f32 scale per token and head).
# Each request's prompt starts with its own number, so that no block comes
# from the prefix cache. Prints the medians of RUNS requests. Not a test.
#   scripts/bench-kv-dtype.sh [RUNS] [PROMPT_TOKENS] [SHAPE]
# SHAPE is a tandem-convert --synthetic shape (default stories110M: 12
# layers of 12 heads of 64 dims), written in bf16 with a 2048-token context.
# Run after scripts/build.sh.
set -euo pipefail
runs="${1:-10}"
prompt_tokens="${2:-1024}"
shape="${3:-stories110M}"
source "$(dirname "$0")/bench-common.sh" 23000

model="$work/$shape"
"$bin/tandem-convert" --synthetic "$shape" --seq_len 2048 --tokenizer "$models/tokenizer.bin" \
  --dtype bf16 --output "$model" >/dev/null

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# The prefill worker's KV bytes shipped so far (its metrics port).
shipped() {
  # shellcheck disable=SC2016
  timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" &&
    printf "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3 &&
    grep "^tandem_prefill_kv_transfer_bytes_total" <&3' "$((port + 1100))" |
    awk '{printf "%.0f\n", $NF}'
}
# About PROMPT_TOKENS tokens of words (one token a word, space included).
words=$(awk -v n=$((prompt_tokens / 10)) 'BEGIN {
  for (i = 0; i < n; i++) printf "the small cat saw a big red ball and ran " }')

printf 'shape %s (bf16 weights), prompts of about %s tokens, median of %s requests, 1 thread per process\n' \
  "$shape" "$prompt_tokens" "$runs"
printf '%-6s %14s %16s %12s %12s\n' "KV" "prompt tokens" "KV bytes/prompt" "vs bf16" "TTFT ms"
bf16_bytes=""
for kv in bf16 int8; do
  cluster_up --prefill 1 --decode 1 --kv_dtype "$kv"
  log="$work/$kv.log"
  : >"$log"
  before=$(shipped)
  for r in $(seq "$runs"); do
    "$bin/tandem-cli" generate --router "127.0.0.1:$port" --prompt "$r $words" --max-tokens 4 \
      2>>"$log" >/dev/null
  done
  after=$(shipped)
  cluster_down
  grep -q disaggregated "$log" || { echo "no request was disaggregated: $(cat "$log")" >&2; exit 1; }
  bytes=$(((after - before) / runs))
  [ -n "$bf16_bytes" ] || bf16_bytes=$bytes
  tokens=$(grep -o 'prompt [0-9]* tokens' "$log" | awk '{print $2}' | median)
  ttft=$(grep -o 'TTFT [0-9.]*' "$log" | awk '{print $2}' | median)
  printf '%-6s %14s %16s %12.3f %12.1f\n' "$kv" "$tokens" "$bytes" \
    "$(awk -v a="$bytes" -v b="$bf16_bytes" 'BEGIN {print a / b}')" "$ttft"
done
