#!/usr/bin/env bash
# Soak: a local cluster (router, 2 prefill and 2 decode workers, stories260K
# from ../shared/models) under a mixed load for DURATION, watching every
# process's memory and descriptors.
#
#   scripts/soak.sh DURATION [--rate R]      e.g. scripts/soak.sh 1h
#
# DURATION: 90s, 10m, 1h (a bare number is seconds). Without --rate the
# script measures the cluster's capacity first (tandem-bench, 8 streams in
# flight for 20 s) and loads it at 70% of that: 60% of the rate as gRPC
# streams and 30% as HTTP streams (tandem-bench; at most 32 and 16 in
# flight, as clients' connection pools would, so that a moment the machine
# is slower queues requests at the client rather than past the decode
# workers' 64 sequences each), and about 3 requests a second of extras
# (tandem-cli, curl): streams cancelled mid-way over HTTP and gRPC, and bad
# requests that must be refused with the right code
# (invalid JSON 400, a prompt over the context 400, a negative temperature
# 400 and INVALID_ARGUMENT, an unknown model 404).
# Every TANDEM_SOAK_SAMPLE_S seconds (60) it samples RSS (VmRSS) and open
# descriptors (/proc/PID/fd) of every process. The warm-up is the first
# TANDEM_SOAK_WARMUP_S seconds (a fifth of DURATION, 5 min at most).
# At the end it prints per process RSS and descriptors at the end of the
# warm-up and at the end, requests by outcome, and exits 1 if a request that
# should have succeeded failed, a bad request got another answer, a KV block
# is still held once the load is over, or RSS or descriptors grew more than
# 5% after warm-up (descriptors: the least of the first three samples after
# warm-up against the least of the last three, and by more than 2, since the
# router's count moves with each client connection open at the moment).
# Ports: TANDEM_SOAK_PORT (8700) and the cluster's ports above it
# (deploy/local/cluster.sh); files in TANDEM_SOAK_DIR (/tmp/tandem-soak).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
port="${TANDEM_SOAK_PORT:-8700}"
http_port=$((port + 1))
dir="${TANDEM_SOAK_DIR:-/tmp/tandem-soak}"
sample_s="${TANDEM_SOAK_SAMPLE_S:-60}"

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
}
die() {
  echo "soak: $*" >&2
  exit 2
}

[ $# -ge 1 ] || usage
case "$1" in
  *h) duration=$((${1%h} * 3600)) ;;
  *m) duration=$((${1%m} * 60)) ;;
  *s) duration=${1%s} ;;
  *) duration=$1 ;;
esac
[[ "$duration" =~ ^[0-9]+$ ]] && [ "$duration" -ge 60 ] ||
  die "DURATION '$1' must be at least 60 s (e.g. 90s, 10m, 1h)"
shift
rate=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
    *) usage ;;
  esac
done
warmup="${TANDEM_SOAK_WARMUP_S:-$((duration / 5 < 300 ? duration / 5 : 300))}"
for b in tandem-router tandem-prefill tandem-decode tandem-bench tandem-cli; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing: build first (scripts/build.sh)"
done
command -v curl >/dev/null || die "curl is missing (scripts/install-deps.sh)"

rm -rf "$dir"
mkdir -p "$dir"
export TANDEM_CLUSTER_DIR="$dir/cluster" TANDEM_BIN="$bin"
"$root/deploy/local/cluster.sh" up --port "$port"
pids=()
cleanup() {
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  "$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
model=$(curl -sf "http://127.0.0.1:$http_port/v1/models" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')

bench_common=(--progress=false --input_len 64 --output_len 64 --range_ratio 0.5
  --request_timeout_s 120)
if [ -z "$rate" ]; then
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" "${bench_common[@]}" \
    --max_concurrency 8 --duration 20 --result_json "$dir/capacity.json" >"$dir/capacity.txt"
  capacity=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["request_throughput"])' \
    "$dir/capacity.json")
  rate=$(python3 -c "print(round(0.7 * $capacity, 2))")
  echo "soak: capacity $capacity requests/s; loading at 70%: $rate requests/s"
fi
grpc_rate=$(python3 -c "print(0.6 * $rate)")
http_rate=$(python3 -c "print(0.3 * $rate)")

# Samples: seconds since the start, process, pid, RSS KiB, descriptors.
sample() {
  local t=$1 f name pid rss fds
  for f in "$TANDEM_CLUSTER_DIR"/*.pid; do
    name=$(basename "$f" .pid)
    pid=$(cat "$f")
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    echo "$t $name $pid ${rss:-0} $fds" >>"$dir/samples.txt"
  done
}
start=$(date +%s)
sampler() {
  local next=0 warm_done=0 now
  while true; do
    now=$(($(date +%s) - start))
    if [ "$warm_done" = 0 ] && [ "$now" -ge "$warmup" ]; then
      sample "$now"
      echo "$now" >"$dir/warmup_sample_at"
      warm_done=1
    elif [ "$now" -ge "$next" ]; then
      sample "$now"
      next=$((now + sample_s))
    fi
    sleep 1
  done
}

# Extras: one line per request, "KIND OUTCOME", OUTCOME expected or
# unexpected:DETAIL.
long_prompt=$(python3 -c 'print("once upon a time " * 400)')
post() {  # post BODY [curl args...]: prints the HTTP code
  local body=$1
  shift
  curl -s -o /dev/null -w '%{http_code}' "$@" -X POST "http://127.0.0.1:$http_port/v1/completions" \
    -H 'Content-Type: application/json' -d "$body" || true
}
expect_code() {  # expect_code KIND WANT GOT
  if [ "$3" = "$2" ]; then echo "$1 expected"; else echo "$1 unexpected:http_$3"; fi
}
extras() {
  local i=0 code out rc
  while true; do
    case $((i % 8)) in
      0 | 1)  # An HTTP stream the client drops mid-way (or that finished first).
        code=$(post '{"prompt":"Once upon a time","max_tokens":400,"ignore_eos":true,"stream":true}' \
          --max-time 0.3)
        case "$code" in
          # 000: dropped before the headers came (a busy moment).
          200 | 000) echo "cancel_http expected" ;;
          *) echo "cancel_http unexpected:http_$code" ;;
        esac ;;
      2)  # A gRPC stream whose client is stopped (SIGTERM) mid-way.
        rc=0
        timeout 0.2 "$bin/tandem-cli" generate --router "127.0.0.1:$port" \
          --prompt "Once upon a time" --max-tokens 400 >/dev/null 2>"$dir/cli.err" || rc=$?
        case "$rc" in
          0 | 124) echo "cancel_grpc expected" ;;
          *) echo "cancel_grpc unexpected:rc_$rc:$(tr '\n' ' ' <"$dir/cli.err")" ;;
        esac ;;
      3) expect_code bad_json 400 "$(post '{"prompt": "Once upon a')" ;;
      4) expect_code too_long_http 400 "$(post "{\"prompt\":\"$long_prompt\",\"max_tokens\":4}")" ;;
      5) expect_code bad_param_http 400 "$(post '{"prompt":"hi","max_tokens":4,"temperature":-1}')" ;;
      6)
        out=$("$bin/tandem-cli" generate --router "127.0.0.1:$port" --prompt "hi" --max-tokens 4 \
          --temperature -1 2>&1 >/dev/null || true)
        if [[ "$out" == *INVALID_ARGUMENT* ]]; then
          echo "bad_param_grpc expected"
        else
          echo "bad_param_grpc unexpected:$(echo "$out" | tr '\n' ' ')"
        fi ;;
      7) expect_code unknown_model 404 "$(post '{"prompt":"hi","max_tokens":4,"model":"nope"}')" ;;
    esac
    i=$((i + 1))
    sleep 0.3
  done
}

sampler &
pids+=($!)
extras >>"$dir/extras.txt" &
pids+=($!)
"$bin/tandem-bench" --target "grpc://127.0.0.1:$port" "${bench_common[@]}" \
  --request_rate "$grpc_rate" --max_concurrency 32 --duration "$duration" --seed 1 \
  --result_json "$dir/grpc.json" >"$dir/grpc.txt" &
grpc_bench=$!
"$bin/tandem-bench" --target "http://127.0.0.1:$http_port/v1/completions" --model "$model" \
  "${bench_common[@]}" --request_rate "$http_rate" --max_concurrency 16 --duration "$duration" \
  --seed 2 \
  --result_json "$dir/http.json" >"$dir/http.txt" &
http_bench=$!
echo "soak: $duration s of load ($grpc_rate gRPC + $http_rate HTTP streams/s and extras);" \
  "warm-up $warmup s, samples every $sample_s s in $dir/samples.txt"
status=0
wait "$grpc_bench" || status=1
wait "$http_bench" || status=1
# The last sample, under the load's last seconds.
sample "$(($(date +%s) - start))"
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()
[ "$status" = 0 ] || echo "soak: tandem-bench failed; see $dir/grpc.txt and $dir/http.txt"

# Once the load is over every KV block comes back (cancelled streams too).
sleep 5
held=""
for f in "$TANDEM_CLUSTER_DIR"/*-*.pid; do
  name=$(basename "$f" .pid)
  mport=$(($(cat "$TANDEM_CLUSTER_DIR/$name.port") + 1000))
  used=$(curl -sf "http://127.0.0.1:$mport/metrics" | awk '/^tandem_[a-z]+_kv_blocks_used / {print $2}')
  [ "${used:-x}" = 0 ] || held="$held $name:${used:-unreadable}"
done

python3 - "$dir" "$(cat "$dir/warmup_sample_at" 2>/dev/null || echo -1)" "$held" "$status" <<'EOF'
import collections, json, sys
d, warm_at, held, bench_status = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
ok = True
samples = collections.defaultdict(list)
for line in open(f"{d}/samples.txt"):
    t, name, pid, rss, fds = line.split()
    samples[name].append((int(t), int(rss), int(fds)))
print(f"{'process':<10} {'RSS warm (KiB)':>15} {'RSS end (KiB)':>14} {'change':>8}"
      f" {'fds warm':>9} {'fds end':>8} {'change':>8}")
for name in sorted(samples):
    s = samples[name]
    after = [x for x in s if x[0] >= warm_at] if warm_at >= 0 else []
    if len(after) < 2:
        print(f"{name:<10} no sample after the warm-up")
        ok = False
        continue
    warm, end = after[0], after[-1]
    # Descriptors: the least of three samples, since each also counts the
    # client connections open at that moment (the router's HTTP clients).
    warm_fds = min(x[2] for x in after[:3])
    end_fds = min(x[2] for x in after[-3:])
    rss_pct = 100.0 * (end[1] - warm[1]) / warm[1]
    fds_pct = 100.0 * (end_fds - warm_fds) / warm_fds
    bad = rss_pct > 5 or (fds_pct > 5 and end_fds - warm_fds > 2)
    ok = ok and not bad
    print(f"{name:<10} {warm[1]:>15} {end[1]:>14} {rss_pct:>+7.1f}% {warm_fds:>9} {end_fds:>8}"
          f" {fds_pct:>+7.1f}%{'  GREW' if bad else ''}")
print()
print(f"{'requests':<34} {'outcome':<12} {'count':>8}")
for kind in ("grpc", "http"):
    try:
        r = json.load(open(f"{d}/{kind}.json"))
    except (OSError, ValueError):
        print(f"{kind + ' streams (tandem-bench)':<34} no result")
        ok = False
        continue
    print(f"{kind + ' streams (tandem-bench)':<34} {'ok':<12} {r['completed']:>8}")
    print(f"{kind + ' streams (tandem-bench)':<34} {'failed':<12} {r['failed']:>8}")
    if r["failed"]:
        ok = False
        for e in r.get("errors", [])[:3]:
            print(f"  {e}")
extras = collections.Counter()
unexpected = collections.Counter()
for line in open(f"{d}/extras.txt"):
    kind, outcome = line.rstrip("\n").split(" ", 1)
    if outcome == "expected":
        extras[kind] += 1
    else:
        unexpected[(kind, outcome)] += 1
for kind, n in sorted(extras.items()):
    print(f"{kind:<34} {'as expected':<12} {n:>8}")
for (kind, outcome), n in sorted(unexpected.items()):
    print(f"{kind:<34} {'UNEXPECTED':<12} {n:>8}  {outcome[:100]}")
    ok = False
if held:
    print("KV blocks still held after the load:", " ".join(held))
    ok = False
if bench_status != "0":
    ok = False
print("\nsoak:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
