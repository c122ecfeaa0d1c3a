#!/usr/bin/env bash
# Distributed overhead per request: single-request TTFT and decode tokens/s
# through a local cluster (1 router, 1 prefill, 1 decode worker; KV over UCX)
# against tandem-generate in one process, same model, same prompt, greedy.
# Prints the medians of N runs and their ratio. Not a test.
#   scripts/bench-cluster.sh [MODEL TOKENIZER] [RUNS] [MAX_TOKENS]
# Without a model, stories260K from ../shared/models. Run after scripts/build.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
models="${TANDEM_MODELS:-$root/../shared/models}"
model="${1:-$models/stories260K.bin}"
tokenizer="${2:-$models/tok512.bin}"
runs="${3:-20}"
max_tokens="${4:-128}"
bin="$root/build/bin"
port=$((21000 + $$ % 10000))
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$(mktemp -d)"
prompt="Once upon a time, there was a little girl named Lily. She loved to play outside"
trap '"$root/deploy/local/cluster.sh" down >/dev/null 2>&1; rm -rf "$TANDEM_CLUSTER_DIR"' EXIT

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
field() { grep -o "$1 [0-9.]*" | awk '{print $2}'; }   # "TTFT 1.23" -> 1.23

: >"$TANDEM_CLUSTER_DIR/local" ; : >"$TANDEM_CLUSTER_DIR/remote"
for _ in $(seq "$runs"); do
  "$bin/tandem-generate" --model "$model" --tokenizer "$tokenizer" --threads 1 \
    --prompt "$prompt" --max-tokens "$max_tokens" 2>>"$TANDEM_CLUSTER_DIR/local" >/dev/null
done
for mode in "--prefill 1 --decode 1" "--prefill 0 --decode 1"; do
  # shellcheck disable=SC2086
  "$root/deploy/local/cluster.sh" up --port "$port" --model "$model" --tokenizer "$tokenizer" $mode 2>/dev/null
  out="$TANDEM_CLUSTER_DIR/remote-${mode// /}"
  : >"$out"
  for _ in $(seq "$runs"); do
    "$bin/tandem-cli" generate --router "127.0.0.1:$port" --prompt "$prompt" \
      --max-tokens "$max_tokens" 2>>"$out" >/dev/null
  done
  "$root/deploy/local/cluster.sh" down 2>/dev/null
done

local_ttft=$(field TTFT <"$TANDEM_CLUSTER_DIR/local" | median)
local_tps=$(grep -o 'decode [0-9.]* tok/s' "$TANDEM_CLUSTER_DIR/local" | awk '{print $2}' | median)
printf 'model %s, prompt %s chars, %s tokens, median of %s runs, 1 thread per process\n' \
  "$(basename "$model")" "${#prompt}" "$max_tokens" "$runs"
printf '%-38s %10s %12s %12s %10s\n' "path" "TTFT ms" "+ms vs local" "decode tok/s" "ratio"
printf '%-38s %10.2f %12s %12.1f %10s\n' "tandem-generate (one process)" "$local_ttft" "-" "$local_tps" "1.00"
for mode in "--prefill 1 --decode 1" "--prefill 0 --decode 1"; do
  out="$TANDEM_CLUSTER_DIR/remote-${mode// /}"
  ttft=$(field TTFT <"$out" | median)
  tps=$(grep -o 'decode [0-9.]* tok/s' "$out" | awk '{print $2}' | median)
  name="cluster, disaggregated"
  [ "$mode" = "--prefill 0 --decode 1" ] && name="cluster, colocated (decode prefills)"
  printf '%-38s %10.2f %12.2f %12.1f %10.2f\n' "$name" "$ttft" \
    "$(awk -v a="$ttft" -v b="$local_ttft" 'BEGIN {print a - b}')" "$tps" \
    "$(awk -v a="$tps" -v b="$local_tps" 'BEGIN {print a / b}')"
done
