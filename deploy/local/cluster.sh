#!/usr/bin/env bash
# A tandem cluster on one host: one router, N prefill and M decode workers on
# loopback, KV moving between them over UCX.
#
#   deploy/local/cluster.sh up [--prefill N] [--decode M] [--port P]
#                              [--model PATH] [--tokenizer PATH] [--threads T]
#   deploy/local/cluster.sh status
#   deploy/local/cluster.sh down
#
# The model is stories260K from ../shared/models (or $TANDEM_MODELS); without
# the fixtures a synthetic model of the same shape is generated (random
# weights, byte-level vocabulary). Logs, pid and port files go under
# $TANDEM_CLUSTER_DIR (default /tmp/tandem-cluster). Binaries come from
# $TANDEM_BIN (default build/bin); build them first (scripts/build.sh).
# Workers use ports P+100.. (prefill) and P+200.. (decode); P is the router's
# gRPC port, 8100 by default; P+1 serves the OpenAI-compatible HTTP API
# (/v1/completions, /v1/models, /health). Each process serves Prometheus
# metrics on its gRPC port + 1000 (/metrics), and the router appends one JSON
# line per request to $TANDEM_CLUSTER_DIR/requests.jsonl. `up --prefill 0` starts the
# colocated baseline: decode workers that prefill every prompt themselves.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
dir="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster}"
models="${TANDEM_MODELS:-$root/../shared/models}"

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

die() {
  echo "cluster: $*" >&2
  exit 1
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Waits until the process of pid file $1 has written port file $2.
wait_for_port() {
  local pid_file=$1 port_file=$2 name=$3
  for _ in $(seq 1 600); do
    [ -s "$port_file" ] && return 0
    alive "$pid_file" || die "$name exited during start-up; see $dir/$name.log:
$(tail -n 20 "$dir/$name.log")"
    sleep 0.1
  done
  die "$name did not start within 60 s; see $dir/$name.log"
}

# start NAME BINARY ARGS...: runs one process in the background.
start() {
  local name=$1
  shift
  rm -f "$dir/$name.port"
  nohup "$@" --port_file "$dir/$name.port" >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

synthetic_model() {
  local model="$dir/synthetic-stories260K.bin" tokenizer="$dir/synthetic-tokenizer.bin"
  if [ ! -f "$model" ]; then
    "$bin/tandem-synth" --output "$model" --shape custom --dim 64 --hidden_dim 172 \
      --n_layers 5 --n_heads 8 --n_kv_heads 4 --vocab_size 512 --seq_len 512 \
      --tokenizer_output "$tokenizer" >&2
  fi
  echo "$model $tokenizer"
}

cmd_up() {
  local n_prefill=2 n_decode=2 port=8100 model="" tokenizer="" threads=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --prefill) n_prefill=$2; shift 2 ;;
      --decode) n_decode=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --model) model=$2; shift 2 ;;
      --tokenizer) tokenizer=$2; shift 2 ;;
      --threads) threads=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  [ "$n_decode" -ge 1 ] || die "--decode must be at least 1"
  for b in tandem-router tandem-prefill tandem-decode tandem-synth; do
    [ -x "$bin/$b" ] || die "$bin/$b is missing: build first (scripts/build.sh)"
  done
  mkdir -p "$dir"
  for f in "$dir"/*.pid; do
    [ -e "$f" ] || continue
    alive "$f" && die "a cluster is already running from $dir; run '$0 down' first"
    rm -f "$f"
  done
  if [ -z "$model" ]; then
    if [ -f "$models/stories260K.bin" ] && [ -f "$models/tok512.bin" ]; then
      model="$models/stories260K.bin"
      tokenizer="$models/tok512.bin"
    else
      echo "cluster: no fixtures in $models; using a synthetic model (random weights)" >&2
      read -r model tokenizer < <(synthetic_model)
    fi
  fi
  [ -f "$model" ] || die "model $model not found"
  [ -n "$tokenizer" ] && [ -f "$tokenizer" ] || die "tokenizer '$tokenizer' not found: pass --tokenizer"

  local prefill_addrs=() decode_addrs=()
  for i in $(seq 0 $((n_prefill - 1))); do
    [ "$n_prefill" -gt 0 ] || break
    start "prefill-$i" "$bin/tandem-prefill" --listen "127.0.0.1:$((port + 100 + i))" \
      --metrics_listen "127.0.0.1:$((port + 1100 + i))" --model "$model" --threads "$threads"
    prefill_addrs+=("127.0.0.1:$((port + 100 + i))")
  done
  for i in $(seq 0 $((n_decode - 1))); do
    start "decode-$i" "$bin/tandem-decode" --listen "127.0.0.1:$((port + 200 + i))" \
      --metrics_listen "127.0.0.1:$((port + 1200 + i))" --model "$model" --threads "$threads"
    decode_addrs+=("127.0.0.1:$((port + 200 + i))")
  done
  for f in "$dir"/prefill-*.pid "$dir"/decode-*.pid; do
    [ -e "$f" ] || continue
    local name
    name=$(basename "$f" .pid)
    wait_for_port "$f" "$dir/$name.port" "$name"
  done
  start router "$bin/tandem-router" --listen "127.0.0.1:$port" --tokenizer "$tokenizer" \
    --metrics_listen "127.0.0.1:$((port + 1000))" --request_log "$dir/requests.jsonl" \
    --http_listen "127.0.0.1:$((port + 1))" \
    --prefill_workers "$(IFS=,; echo "${prefill_addrs[*]}")" \
    --decode_workers "$(IFS=,; echo "${decode_addrs[*]}")"
  wait_for_port "$dir/router.pid" "$dir/router.port" router
  echo "cluster: router on 127.0.0.1:$port, $n_prefill prefill and $n_decode decode workers," \
    "model $(basename "$model"); logs in $dir" >&2
}

cmd_status() {
  local any=0
  for f in "$dir"/*.pid; do
    [ -e "$f" ] || continue
    any=1
    local name state port
    name=$(basename "$f" .pid)
    if alive "$f"; then state="running"; else state="exited"; fi
    port=$(cat "$dir/$name.port" 2>/dev/null || echo "-")
    printf '%-10s pid %-8s port %-6s %s\n' "$name" "$(cat "$f")" "$port" "$state"
  done
  [ "$any" -eq 1 ] || echo "cluster: nothing running from $dir"
}

cmd_down() {
  local pids=()
  # The router first, so that it stops sending work to workers going away.
  for f in "$dir"/router.pid "$dir"/prefill-*.pid "$dir"/decode-*.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then
      kill -TERM "$(cat "$f")" 2>/dev/null || true
      pids+=("$(cat "$f")")
    fi
  done
  # Workers drain in-flight requests; give them up to 40 s, then kill.
  for _ in $(seq 1 400); do
    local left=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ "$left" -eq 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null && { echo "cluster: pid $p did not drain; killing" >&2; kill -KILL "$p"; }
  done
  rm -f "$dir"/*.pid "$dir"/*.port
  echo "cluster: stopped (${#pids[@]} processes)" >&2
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) usage ;;
esac
