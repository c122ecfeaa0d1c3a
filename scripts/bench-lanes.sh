#!/usr/bin/env bash
# KV transfer striping ("lanes") over a long path whose every TCP flow is
# capped: how much of the link N lanes recover, and the cluster's TTFT with
# 1 and 4 lanes. Not a test; needs root and iproute2 (ip netns, tc).
#
#   scripts/bench-lanes.sh [kv|cluster|all]      (default: all)
#
# Two network namespaces joined by a veth stand for two data centres:
#  - sender side (S): the kvbench sender, or the router + prefill worker;
#  - receiver side (R): the kvbench receiver, or the decode worker.
# Path shape, on S's egress: an HTB class caps the link at LINK_MBIT, and
# every TCP flow gets a child class of its own with ceil RATE_MBIT (flows are
# told apart by their source port: S's ephemeral ports are limited to 256, one
# class each). Round trip: this kernel has no netem, so tandem-kvbench-netdelay
# holds every packet R sends (ACKs, answers) for the RTT, through an iptables
# NFQUEUE rule, at a real-time priority. TCP buffers in both namespaces: see
# tcp_rmem / tcp_wmem below (large enough that one flow is held by RATE_MBIT,
# not by its window, at the longest RTT). KV goes over UCX_TLS=tcp.
#
# Knobs (environment): RATE_MBIT (125), LINK_MBIT (8 x RATE_MBIT), RTTS
# ("20 50"), LANES (1,2,4,8), OUT (results folder), CLUSTER_LANES ("1 4"),
# CLUSTER_RTT (20), PROMPT_TOKENS (768), REQUESTS (12).
# Every measurement holds /tmp/tandem-cpu.lock. Results: $OUT/summary.md;
# $OUT/load.txt has the load average as each measurement started.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
what="${1:-all}"
rate="${RATE_MBIT:-125}"
link="${LINK_MBIT:-$((8 * rate))}"
rtts="${RTTS:-20 50}"
lanes="${LANES:-1,2,4,8}"
cluster_lanes="${CLUSTER_LANES:-1 4}"
cluster_rtt="${CLUSTER_RTT:-20}"
prompt_tokens="${PROMPT_TOKENS:-768}"
requests="${REQUESTS:-12}"
out="${OUT:-/tmp/bench-lanes-$$}"

die() { echo "bench-lanes: $*" >&2; exit 1; }
case "$what" in kv | cluster | all) ;; *) die "usage: $0 [kv|cluster|all]" ;; esac
[ "$(id -u)" -eq 0 ] || die "needs root (it creates network namespaces and qdiscs)"
ip netns list >/dev/null 2>&1 || die "needs 'ip netns' (iproute2) and network namespaces"
for tool in tc iptables-legacy chrt python3 flock; do
  command -v "$tool" >/dev/null || die "needs $tool"
done
for b in tandem-kvbench tandem-kvbench-netdelay tandem-prefill tandem-decode tandem-router \
  tandem-bench tandem-synth; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing: build it first (scripts/build.sh)"
done

# Unique names per run: namespaces, veth ends, addresses.
id=$$
ns_s="lanes-s-$id" ns_r="lanes-r-$id"
dev_s="lns$((id % 100000))" dev_r="lnr$((id % 100000))"
ip_s=10.211.0.1 ip_r=10.211.0.2
queue=0 # NFQUEUE numbers are per namespace
delay_pid=""
mkdir -p "$out"

# Processes started in the background call ip netns exec themselves: a
# backgrounded function is a subshell, and its $! not the process to stop.
in_s() { ip netns exec "$ns_s" "$@"; }
in_r() { ip netns exec "$ns_r" "$@"; }

cleanup() {
  [ -z "$delay_pid" ] || kill "$delay_pid" 2>/dev/null || true
  # Whatever still runs inside the namespaces (a cluster, a server) goes too.
  for ns in "$ns_s" "$ns_r"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

setup_namespaces() {
  { ip netns add "$ns_s" && ip netns add "$ns_r"; } || die "could not create network namespaces here"
  ip link add "$dev_s" type veth peer name "$dev_r"
  ip link set "$dev_s" netns "$ns_s"
  ip link set "$dev_r" netns "$ns_r"
  in_s ip addr add "$ip_s/24" dev "$dev_s"
  in_r ip addr add "$ip_r/24" dev "$dev_r"
  for ns in "$ns_s" "$ns_r"; do
    ip -n "$ns" link set lo up
    # One flow at RATE_MBIT over the longest RTT needs RATE x RTT in flight
    # (125 Mbit/s x 50 ms = 0.8 MB); 32 MiB of window leaves ample room, and
    # up to 8 MiB of socket send buffer holds that much unacknowledged.
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 33554432" \
      net.ipv4.tcp_wmem="4096 65536 8388608" net.ipv4.tcp_tw_reuse=1
  done
  in_s ip link set "$dev_s" up
  in_r ip link set "$dev_r" up
  # 256 ephemeral ports: the low byte of S's source port picks a flow's class.
  in_s sysctl -qw net.ipv4.ip_local_port_range="40192 40447"
  in_r iptables-legacy -t mangle -A OUTPUT -o "$dev_r" -j NFQUEUE --queue-num "$queue" \
    --queue-bypass
}

# shape on|off: the per-flow cap and the link cap on S's egress.
shape() {
  in_s tc qdisc del dev "$dev_s" root 2>/dev/null || true
  [ "$1" = on ] || return 0
  local batch="$out/tc.batch" i class
  {
    echo "qdisc add dev $dev_s root handle 1: htb default 2"
    echo "class add dev $dev_s parent 1: classid 1:1 htb rate ${link}mbit ceil ${link}mbit quantum 60000"
    # Everything that is not TCP (none in these runs) shares one more flow's cap.
    echo "class add dev $dev_s parent 1:1 classid 1:2 htb rate 1mbit ceil ${rate}mbit quantum 60000"
    echo "filter add dev $dev_s parent 1: prio 1 handle 100: protocol ip u32 divisor 256"
    # TCP's source port is bytes 20-21 of an IPv4 packet without options.
    echo "filter add dev $dev_s parent 1: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask 0x00ff0000 at 20 link 100:"
    for i in $(seq 0 255); do
      class=$(printf %x $((0x100 + i)))
      # A tiny assured rate and ceil RATE: a flow borrows up to RATE from the
      # link while the link has room, so N flows get min(N x RATE, LINK).
      echo "class add dev $dev_s parent 1:1 classid 1:$class htb rate 1mbit ceil ${rate}mbit quantum 60000"
      echo "filter add dev $dev_s parent 1: prio 1 protocol ip u32 ht 100:$(printf %x "$i"): match u32 0 0 flowid 1:$class"
    done
  } >"$batch"
  in_s tc -batch "$batch"
}

# delay MS: R's packets held MS milliseconds (0: no delay program).
delay() {
  if [ -n "$delay_pid" ]; then
    kill "$delay_pid" 2>/dev/null || true
    wait "$delay_pid" 2>/dev/null || true
    delay_pid=""
  fi
  [ "$1" -gt 0 ] || return 0
  ip netns exec "$ns_r" chrt -f 50 "$bin/tandem-kvbench-netdelay" --queue "$queue" --delay_ms "$1" &
  delay_pid=$!
  sleep 0.3
  kill -0 "$delay_pid" 2>/dev/null || die "tandem-kvbench-netdelay did not start"
}

# tcp_streams N SECONDS: plain TCP streams S -> R; prints their JSON line.
tcp_streams() {
  in_s python3 "$root/scripts/lanes_tcp.py" client "$ip_r" 5201 "$1" "$2"
}

# kvbench NAME ARGS...: tandem-kvbench with its receiver in R; output to NAME.
kvbench() {
  local name=$1
  shift
  echo "$name $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.txt"
  UCX_TLS=tcp in_s env UCX_NET_DEVICES="$dev_s" "$bin/tandem-kvbench" --perftest=false \
    --checksums=off --in_flight 1 --receiver_prefix "ip netns exec $ns_r env UCX_NET_DEVICES=$dev_r" "$@" \
    >"$out/$name.txt" 2>&1 || die "kvbench $name failed: $(tail -5 "$out/$name.txt")"
  grep '^{"bench":"kvbench"' "$out/$name.txt" >"$out/$name.json"
}

# Holds the CPU lock per part (the CPU ceiling about 1 minute, each RTT about
# 5), so that no one hold lasts 10 minutes.
run_kv() {
  exec 9>/tmp/tandem-cpu.lock
  flock 9
  ip netns exec "$ns_r" python3 "$root/scripts/lanes_tcp.py" server 5201 &
  local server=$!
  sleep 0.5
  # What this machine moves with no cap and no delay: the CPU's ceiling.
  shape off
  delay 0
  for n in 1 8; do tcp_streams "$n" 3 | sed "s/^/{\"rtt\":0,\"shaped\":false,\"tcp\":/; s/\$/}/"; done \
    >"$out/tcp-unshaped.jsonl"
  kvbench kv-unshaped --lanes 1,8 --sizes 1MiB --layers 32 --transfers 20 --warmup 2 --repeats 1
  shape on
  for rtt in $rtts; do
    flock -u 9
    flock 9
    delay "$rtt"
    for n in 1 2 4 8 16; do
      tcp_streams "$n" 4 | sed "s/^/{\"rtt\":$rtt,\"shaped\":true,\"tcp\":/; s/\$/}/"
    done >"$out/tcp-rtt$rtt.jsonl"
    # 32 layers x 1 MiB, and a 2048-token prompt of an 8B GQA model
    # (Llama-3-8B: 32 layers x 2 x 8 KV heads x 128 x 2 bytes x 2048 = 8 MiB a layer).
    kvbench "kv-rtt$rtt-1MiB" --lanes "$lanes" --sizes 1MiB --layers 32 --transfers 6 \
      --warmup 1 --repeats 3
    kvbench "kv-rtt$rtt-8MiB" --lanes "$lanes" --sizes 8MiB --layers 32 --transfers 2 \
      --warmup 1 --repeats 1
  done
  delay 0
  kill "$server"
  wait "$server" 2>/dev/null || true
  flock -u 9
}

# The cluster: router + prefill worker in S, decode worker in R, a synthetic
# model whose KV is large for its compute (narrow, deep, multi-head).
run_cluster() {
  local model="$out/kv-heavy.bin" tokenizer="$out/kv-heavy-tok.bin"
  "$bin/tandem-synth" --output "$model" --shape custom --dim 128 --hidden_dim 344 \
    --n_layers 32 --n_heads 4 --n_kv_heads 4 --vocab_size 512 --seq_len 2048 \
    --tokenizer_output "$tokenizer" >"$out/synth.log" 2>&1
  exec 9>/tmp/tandem-cpu.lock
  flock 9
  # KV over TCP, as between data centres: the two workers share this host,
  # and UCX would otherwise pick shared memory.
  export UCX_TLS=tcp
  # First one lane with no cap and no delay: the TTFT of compute and
  # protocol alone, which the path then adds to.
  local config rtt l
  for config in 0:1 $(for l in $cluster_lanes; do echo "$cluster_rtt:$l"; done); do
    rtt=${config%:*} l=${config#*:}
    if [ "$rtt" -eq 0 ]; then shape off; else shape on; fi
    delay "$rtt"
    local dir="$out/cluster-rtt$rtt-lanes$l"
    mkdir -p "$dir"
    echo "cluster-rtt$rtt-lanes$l $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.txt"
    local pids=()
    ip netns exec "$ns_r" "$bin/tandem-decode" --listen "$ip_r:8300" --metrics_listen "127.0.0.1:9300" \
      --model "$model" --threads 1 --kv_net_devices "$dev_r" --port_file "$dir/decode.port" \
      >"$dir/decode.log" 2>&1 &
    pids+=($!)
    ip netns exec "$ns_s" "$bin/tandem-prefill" --listen "127.0.0.1:8200" --metrics_listen "127.0.0.1:9200" \
      --model "$model" --threads 1 --kv_net_devices "$dev_s" --kv_lanes "$l" \
      --port_file "$dir/prefill.port" >"$dir/prefill.log" 2>&1 &
    pids+=($!)
    for f in decode prefill; do
      for _ in $(seq 600); do [ -s "$dir/$f.port" ] && break; sleep 0.1; done
      [ -s "$dir/$f.port" ] || die "$f worker did not start: $(tail -5 "$dir/$f.log")"
    done
    # A prefill answers once its KV has shipped: at one lane a 24 MiB KV
    # alone takes about 2 s, past the router's default 2 s per 1024 tokens.
    ip netns exec "$ns_s" "$bin/tandem-router" --listen "127.0.0.1:8100" --tokenizer "$tokenizer" \
      --prefill_workers 127.0.0.1:8200 --decode_workers "$ip_r:8300" \
      --prefill_answer_timeout 60s --port_file "$dir/router.port" \
      --request_log "$dir/requests.jsonl" >"$dir/router.log" 2>&1 &
    pids+=($!)
    disown "${pids[@]}"
    for _ in $(seq 600); do [ -s "$dir/router.port" ] && break; sleep 0.1; done
    [ -s "$dir/router.port" ] || die "router did not start: $(tail -5 "$dir/router.log")"
    # One request at a time: TTFT is prefill + KV transfer + first token,
    # without queueing behind other requests.
    in_s "$bin/tandem-bench" --target grpc://127.0.0.1:8100 --input_len "$prompt_tokens" \
      --output_len 4 --num_requests "$requests" --max_concurrency 1 --vocab_size 512 \
      --progress=false --result_json "$dir/bench.json" >"$dir/bench.txt" 2>&1 ||
      die "tandem-bench failed: $(tail -5 "$dir/bench.txt")"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local alive p
    for _ in $(seq 100); do
      alive=0
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ "$alive" -eq 1 ] || break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
  done
  unset UCX_TLS
  delay 0
  flock -u 9
}

setup_namespaces
case "$what" in
  kv) run_kv ;;
  cluster) run_cluster ;;
  all) run_kv; run_cluster ;;
esac
python3 "$root/scripts/lanes_report.py" "$out" "$rate" "$link" | tee "$out/summary.md"
