#!/usr/bin/env bash
# A tandem cluster on one host: one router, N prefill and M decode workers on
# loopback, KV moving between them over UCX.
#
#   deploy/local/cluster.sh up [--prefill N] [--decode M] [--port P]
#                              [--model DIR | --model FILE --tokenizer FILE]
#                              [--kv_dtype f32|bf16|f16|int8] [--served_model_name NAME]
#                              [--threads T] [--router_args "ARGS"]
#                              [--prefill_args "ARGS"] [--decode_args "ARGS"]
#                              [--prefill_cpus LIST] [--decode_cpus LIST]
#   deploy/local/cluster.sh scale [--prefill N] [--decode M]
#   deploy/local/cluster.sh status
#   deploy/local/cluster.sh down
#
# --model DIR is a Hugging Face folder (config.json, safetensors,
# tokenizer.json): the workers load its weights and the router its tokenizer.
# A model FILE (llama2.c or GGUF) needs its --tokenizer. Without --model the
# model is stories260K from ../shared/models (or $TANDEM_MODELS); without the
# fixtures a synthetic model of the same shape is generated (random weights,
# byte-level vocabulary). --kv_dtype sets every worker's KV cache type (default:
# the weights' type). Logs, pid and port files go under
# $TANDEM_CLUSTER_DIR (default /tmp/tandem-cluster). Binaries come from
# $TANDEM_BIN (default build/bin); build them first (scripts/build.sh).
# Workers use ports P+100.. (prefill) and P+200.. (decode); P is the router's
# gRPC port, 8100 by default; P+1 serves the OpenAI-compatible HTTP API
# (/v1/completions, /v1/models, /health). Each process serves Prometheus
# metrics on its gRPC port + 1000 (/metrics), and the router appends one JSON
# line per request to $TANDEM_CLUSTER_DIR/requests.jsonl. `up --prefill 0` starts the
# colocated baseline: decode workers that prefill every prompt themselves.
# --router_args adds flags to the router's command line, split at spaces
# (e.g. --router_args "--api_key KEY --max_inflight 8"); --prefill_args and
# --decode_args do the same for every prefill or decode worker (e.g.
# --decode_args "--noprefix_cache"). --prefill_cpus and --decode_cpus pin
# those workers to CPUs (taskset lists, e.g. 0 or 2-3), for benchmarks.
# The router takes its pools from files ($TANDEM_CLUSTER_DIR/prefill.targets
# and decode.targets, re-read every second): `scale` grows a pool by
# starting workers (as `up` started them) and listing them once they serve,
# and shrinks it by unlisting the newest, waiting for the router to let them
# go, and stopping them (SIGTERM: each drains what it is serving), so that
# no request fails (tandem-planner's apply mode runs it).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
dir="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster}"
models="${TANDEM_MODELS:-$root/../shared/models}"

usage() {
  sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'
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

# start_worker ROLE I: starts worker I of ROLE (prefill or decode) as `up`
# started its pool (the settings in $dir/workers.env), not yet listed.
start_worker() {
  local role=$1 i=$2 offset=100 pin=()
  [ "$role" = decode ] && offset=200
  if [ "$role" = prefill ]; then
    pin=(${prefill_pin[@]+"${prefill_pin[@]}"})
    start "prefill-$i" ${pin[@]+"${pin[@]}"} "$bin/tandem-prefill" \
      --listen "127.0.0.1:$((port + offset + i))" --metrics_listen "127.0.0.1:$((port + 1000 + offset + i))" \
      "${worker_model[@]}" --threads "$threads" ${prefill_args[@]+"${prefill_args[@]}"}
  else
    pin=(${decode_pin[@]+"${decode_pin[@]}"})
    start "decode-$i" ${pin[@]+"${pin[@]}"} "$bin/tandem-decode" \
      --listen "127.0.0.1:$((port + offset + i))" --metrics_listen "127.0.0.1:$((port + 1000 + offset + i))" \
      "${worker_model[@]}" --threads "$threads" ${decode_args[@]+"${decode_args[@]}"}
  fi
}

# list_worker ROLE I / unlist_worker ROLE I: adds worker I to (removes it
# from) its pool's targets file, replaced whole so that the router never
# reads half of it.
list_worker() {
  local offset=100
  [ "$1" = decode ] && offset=200
  { cat "$dir/$1.targets"; echo "127.0.0.1:$((port + offset + $2))"; } >"$dir/$1.targets.new"
  mv "$dir/$1.targets.new" "$dir/$1.targets"
}
unlist_worker() {
  local offset=100
  [ "$1" = decode ] && offset=200
  grep -vx "127.0.0.1:$((port + offset + $2))" "$dir/$1.targets" >"$dir/$1.targets.new" || true
  mv "$dir/$1.targets.new" "$dir/$1.targets"
}

# The indices of ROLE's running workers, in order.
running() {
  local f
  for f in "$dir/$1"-*.pid; do
    [ -e "$f" ] || continue
    alive "$f" && basename "$f" .pid | sed "s/^$1-//"
  done | sort -n
}

# The workers the router holds ready in ROLE's pool (its
# tandem_router_workers_ready gauge), read from its metrics port.
router_ready() {
  local line
  # shellcheck disable=SC2016
  line=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" &&
    printf "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3 &&
    grep "^tandem_router_workers_ready{pool=\"$1\"}" <&3' "$((port + 1000))" "$1" || true)
  echo "${line##* }"
}

cmd_scale() {
  local want_prefill="" want_decode=""
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || usage
    case "$1" in
      --prefill) want_prefill=$2; shift 2 ;;
      --decode) want_decode=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  [ -f "$dir/workers.env" ] || die "no cluster started by 'up' in $dir"
  alive "$dir/router.pid" || die "the router of $dir is not running"
  [ -z "$want_decode" ] || [ "$want_decode" -ge 1 ] || die "--decode must be at least 1"
  # shellcheck disable=SC1091
  . "$dir/workers.env"
  local role want have i started=() leaving=()
  for role in prefill decode; do
    want=$want_prefill
    [ "$role" = decode ] && want=$want_decode
    [ -n "$want" ] || continue
    [ "$want" -le 100 ] || die "--$role must be at most 100"
    mapfile -t have < <(running "$role")
    # Grow: the lowest free indices.
    i=0
    while [ "${#have[@]}" -lt "$want" ]; do
      if ! printf '%s\n' "${have[@]}" | grep -qx "$i"; then
        start_worker "$role" "$i"
        started+=("$role-$i")
        have+=("$i")
      fi
      i=$((i + 1))
    done
    # Shrink: the highest indices leave.
    while [ "${#have[@]}" -gt "$want" ]; do
      i=${have[-1]}
      unset 'have[-1]'
      unlist_worker "$role" "$i"
      leaving+=("$role-$i")
    done
  done
  local name
  for name in ${started[@]+"${started[@]}"}; do
    wait_for_port "$dir/$name.pid" "$dir/$name.port" "$name"
    list_worker "${name%-*}" "${name##*-}"
  done
  if [ "${#leaving[@]}" -gt 0 ]; then
    # The router re-reads the files every second: wait (up to 15 s) until
    # it holds only the listed workers, then each leaving one drains what it
    # still serves.
    for role in prefill decode; do
      want=$(grep -c . "$dir/$role.targets" || true)
      for _ in $(seq 1 150); do
        [ "$(router_ready "$role")" = "$want" ] && break
        sleep 0.1
      done
    done
    local pids=()
    for name in "${leaving[@]}"; do
      alive "$dir/$name.pid" && { kill -TERM "$(cat "$dir/$name.pid")"; pids+=("$(cat "$dir/$name.pid")"); }
    done
    for _ in $(seq 1 600); do
      local left=0
      for p in ${pids[@]+"${pids[@]}"}; do kill -0 "$p" 2>/dev/null && left=1; done
      [ "$left" -eq 0 ] && break
      sleep 0.1
    done
    for name in "${leaving[@]}"; do rm -f "$dir/$name.pid" "$dir/$name.port"; done
  fi
  echo "cluster: $(running prefill | wc -l) prefill and $(running decode | wc -l) decode workers" \
    "(started: ${started[*]:-none}; stopped: ${leaving[*]:-none})" >&2
}

cmd_up() {
  local n_prefill=2 n_decode=2 port=8100 model="" tokenizer="" threads=1 kv_dtype="" served_name=""
  local router_args=() prefill_args=() decode_args=() prefill_pin=() decode_pin=()
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || usage
    case "$1" in
      --prefill) n_prefill=$2; shift 2 ;;
      --decode) n_decode=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --model) model=$2; shift 2 ;;
      --tokenizer) tokenizer=$2; shift 2 ;;
      --kv_dtype) kv_dtype=$2; shift 2 ;;
      --served_model_name) served_name=$2; shift 2 ;;
      --threads) threads=$2; shift 2 ;;
      --router_args) read -r -a router_args <<<"$2"; shift 2 ;;
      --prefill_args) read -r -a prefill_args <<<"$2"; shift 2 ;;
      --decode_args) read -r -a decode_args <<<"$2"; shift 2 ;;
      --prefill_cpus) prefill_pin=(taskset -c "$2"); shift 2 ;;
      --decode_cpus) decode_pin=(taskset -c "$2"); shift 2 ;;
      *) usage ;;
    esac
  done
  case "$kv_dtype" in
    "" | f32 | bf16 | f16 | int8) ;;
    *) die "--kv_dtype must be f32, bf16, f16 or int8, not '$kv_dtype'" ;;
  esac
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
  # The router's model arguments: a hub folder brings its own tokenizer.
  local router_model=()
  if [ -d "$model" ]; then
    [ -f "$model/config.json" ] || die "$model is not a Hugging Face model folder (no config.json)"
    router_model=(--model "$model")
    if [ -n "$tokenizer" ]; then
      [ -e "$tokenizer" ] || die "tokenizer '$tokenizer' not found"
      router_model+=(--tokenizer "$tokenizer")
    fi
  else
    [ -f "$model" ] || die "model $model not found"
    [ -n "$tokenizer" ] && [ -e "$tokenizer" ] || die "tokenizer '$tokenizer' not found: pass --tokenizer"
    router_model=(--tokenizer "$tokenizer")
    # Served under the model's name, as the workers report it (not the tokenizer's).
    [ -n "$served_name" ] || served_name=$(basename "$model")
  fi
  [ -z "$served_name" ] || router_model+=(--served_model_name "$served_name")
  local worker_model=(--model "$model")
  # The workers need the token bytes for structured outputs (a hub folder
  # brings its own tokenizer).
  [ -z "$tokenizer" ] || worker_model+=(--tokenizer "$tokenizer")
  [ -z "$kv_dtype" ] || worker_model+=(--kv_dtype "$kv_dtype")
  [ -z "$served_name" ] || worker_model+=(--served_model_name "$served_name")

  # What `scale` needs to start more workers as these were started.
  declare -p port threads worker_model prefill_args decode_args prefill_pin decode_pin \
    >"$dir/workers.env"
  : >"$dir/prefill.targets"
  : >"$dir/decode.targets"
  for i in $(seq 0 $((n_prefill - 1))); do
    [ "$n_prefill" -gt 0 ] || break
    start_worker prefill "$i"
  done
  for i in $(seq 0 $((n_decode - 1))); do
    start_worker decode "$i"
  done
  for f in "$dir"/prefill-*.pid "$dir"/decode-*.pid; do
    [ -e "$f" ] || continue
    local name
    name=$(basename "$f" .pid)
    wait_for_port "$f" "$dir/$name.port" "$name"
    list_worker "${name%-*}" "${name##*-}"
  done
  start router "$bin/tandem-router" --listen "127.0.0.1:$port" "${router_model[@]}" \
    --metrics_listen "127.0.0.1:$((port + 1000))" --request_log "$dir/requests.jsonl" \
    --http_listen "127.0.0.1:$((port + 1))" --resolve_interval 1s \
    --prefill_workers "file:$dir/prefill.targets" --decode_workers "file:$dir/decode.targets" \
    ${router_args[@]+"${router_args[@]}"}
  wait_for_port "$dir/router.pid" "$dir/router.port" router
  echo "cluster: router on 127.0.0.1:$port, $n_prefill prefill and $n_decode decode workers," \
    "model $(basename "$model")${kv_dtype:+, KV $kv_dtype}; logs in $dir" >&2
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
  scale) shift; cmd_scale "$@" ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) usage ;;
esac
