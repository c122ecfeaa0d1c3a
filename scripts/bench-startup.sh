#!/usr/bin/env bash
# How fast the pools rebalance, per model shape (synthetic weights, bf16,
# context 2048, 32,000-token vocabulary to match ../shared/models'
# tokenizer.bin), with the workers' warm-up on (--warm_up_tokens 32, the
# default) and off (0):
#   - ready: `deploy/local/cluster.sh scale` adding one decode worker and
#     then one prefill worker, each timed from its start until the router
#     reports it ready (tandem_router_workers_ready): model load, KV pool,
#     warm-up, listing, the router's next resolve;
#   - first: the first request's latency on a fresh cluster (one prefill and
#     one decode worker just started), a prompt of about 20 tokens and one
#     output token, and the median of the next five (other prompts: no
#     cached prefix);
#   - drain: `scale` back down by both workers (unlist, a resolve interval,
#     SIGTERM, the drain), timed whole.
# The worker logs' own split (load, fingerprint, warm-up) is printed too.
# Not a test: the figures are the machine's. Each worker has one thread.
#
#   scripts/bench-startup.sh [SHAPE...]   (default: stories15M llama3.2-1b)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
models="${TANDEM_MODELS:-$root/../shared/models}"
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(stories15M llama3.2-1b)
work="$(mktemp -d /tmp/tandem-startup.XXXXXX)"
port=$((31000 + $$ % 2000))
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$work/cluster"
cluster="$root/deploy/local/cluster.sh"
trap '"$cluster" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
[ -f "$models/tokenizer.bin" ] || { echo "needs $models/tokenizer.bin"; exit 1; }

ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
timed() { # timed COMMAND...: runs it, prints its wall time in ms
  local t0
  t0=$(date +%s%N)
  "$@" >/dev/null 2>"$work/timed.err" || { cat "$work/timed.err" >&2; exit 1; }
  ms_since "$t0"
}
# Each request's prompt starts with another word, so that none reuses
# another's cached prefix: 23 tokens each, one output token.
n_request=0
request_ms() {
  n_request=$((n_request + 1))
  local words=(Yesterday Tomorrow Suddenly Later Meanwhile Afterwards Finally Often)
  curl -s -o /dev/null -w '%{time_total}' -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"${words[$((n_request % 8))]} there was a little girl who lived in a small house near the woods.\", \"max_tokens\": 1, \"temperature\": 0}" \
    "http://127.0.0.1:$((port + 1))/v1/completions" |
    python3 -c 'import sys; print(round(float(sys.stdin.read()) * 1000, 1))'
}
log_split() { # log_split FILE: the worker's own start-up times
  grep -ohE "hashed in [0-9.]+m?s|warmed up with [0-9]+ tokens in [0-9.]+m?s" "$1" | tr '\n' ' '
}

printf '%-12s %-7s %10s %10s %10s %10s %10s  %s\n' shape warm-up "ready D" "ready P" \
  "first" "next" "drain" "worker log (decode-1)"
for shape in "${shapes[@]}"; do
  model="$work/$shape"
  "$bin/tandem-convert" --synthetic "$shape" --seq_len 2048 --vocab_size 32000 \
    --tokenizer "$models/tokenizer.bin" --output "$model" >/dev/null
  for warm in 32 0; do
    "$cluster" down >/dev/null 2>&1 || true
    rm -rf "$TANDEM_CLUSTER_DIR"
    args=(--port "$port" --model "$model" --threads 1 --prefill_args "--warm_up_tokens $warm"
      --decode_args "--warm_up_tokens $warm")
    "$cluster" up --prefill 1 --decode 1 "${args[@]}" >/dev/null 2>"$work/up.log" ||
      { cat "$work/up.log"; exit 1; }
    first=$(request_ms)
    next=$(for _ in 1 2 3 4 5; do request_ms; done | sort -n | sed -n 3p)
    ready_d=$(timed "$cluster" scale --prefill 1 --decode 2)
    ready_p=$(timed "$cluster" scale --prefill 2 --decode 2)
    drain=$(timed "$cluster" scale --prefill 1 --decode 1)
    printf '%-12s %-7s %8s ms %8s ms %8s ms %8s ms %8s ms  %s\n' "$shape" "$warm" "$ready_d" \
      "$ready_p" "$first" "$next" "$drain" "$(log_split "$TANDEM_CLUSTER_DIR/decode-1.log")"
  done
  "$cluster" down >/dev/null 2>&1 || true
  rm -rf "$model"
done
