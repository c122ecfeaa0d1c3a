#!/usr/bin/env bash
# Simulated against measured: the same workload through a real local
# cluster (deploy/local/cluster.sh, tandem-bench) and through tandem-sim on
# a cost profile measured on this machine (tandem-profile), side by side,
# with the error of each figure. Its full run is not a test: it takes
# minutes and its figures depend on the machine.
#
#   scripts/validate-sim.sh [--check] [REQUESTS]
#
# --check (the ctest `sim_validation`): one light load only, and exit 1 when
# a median or the throughput is off by more than bounds wide enough for a
# loaded machine (TTFT and TPOT medians 50%, throughput 15%), so that the
# simulator cannot drift far from the code it runs unnoticed.
#
# The model is a synthetic stories15M shape (random weights, context 2048)
# served colocated by one decode worker with one thread pinned to the last
# CPU; the router and the client share the others. The profile is measured
# the same way. Loads: light, and about half of what the worker sustains.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
models="${TANDEM_MODELS:-$root/../shared/models}"
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
requests="${1:-40}"
rates=(1 4)
[ "$check" = 1 ] && rates=(2)
work="$(mktemp -d /tmp/tandem-validate.XXXXXX)"
port=$((27000 + $$ % 2000))
last_cpu=$(($(nproc) - 1))
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$work/cluster"
trap '"$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

"$bin/tandem-convert" --synthetic stories15M --seq_len 2048 --tokenizer "$models/tokenizer.bin" \
  --output "$work/model" >/dev/null
# Profiled on the very weights the worker serves (bf16, as tandem-convert
# writes them), on the worker's CPU.
taskset -c "$last_cpu" "$bin/tandem-profile" --model "$work/model" --threads 1 \
  --output "$work/profile.json" | tail -1

# Each load draws its own prompts (a seed of its own), so that none finds
# another's prompts in the real worker's prefix cache.
workload=(--dataset synthetic --range_ratio 0 --vocab_size 32000 --input_len 256 --output_len 64
          --num_requests "$requests")
compare() {  # compare LABEL REAL SIM
  python3 - "$check" "$@" <<'PY'
import json, sys
check, label, real, sim = sys.argv[1] == "1", *sys.argv[2:5]
r = json.load(open(real))["runs"][0]
s = json.load(open(sim))["runs"][0]
rows = [("TTFT p50 ms", r["ttft_ms"]["median"], s["ttft_ms"]["median"]),
        ("TTFT p99 ms", r["ttft_ms"]["p99"], s["ttft_ms"]["p99"]),
        ("TPOT p50 ms", r["tpot_ms"]["median"], s["tpot_ms"]["median"]),
        ("TPOT p99 ms", r["tpot_ms"]["p99"], s["tpot_ms"]["p99"]),
        ("ITL p99 ms", r["itl_ms"]["p99"], s["itl_ms"]["p99"]),
        ("output tok/s", r["output_throughput"], s["output_throughput"])]
bounds = {"TTFT p50 ms": 50, "TPOT p50 ms": 50, "output tok/s": 15}
failed = []
for name, a, b in rows:
    err = (b - a) / a * 100 if a else float("nan")
    print(f"{label:24s} {name:13s} {a:10.2f} {b:10.2f} {err:+7.1f}%")
    if check and name in bounds and not abs(err) <= bounds[name]:
        failed.append(f"{name} off by {err:+.1f}% (bound {bounds[name]}%)")
if failed:
    print("FAIL: the simulation drifted from the measured run: " + "; ".join(failed))
    sys.exit(1)
PY
}

printf "%-24s %-13s %10s %10s %8s\n" configuration figure measured simulated error
"$root/deploy/local/cluster.sh" up --port "$port" --prefill 0 --decode 1 --model "$work/model" \
  --decode_cpus "$last_cpu" --threads 1 >/dev/null 2>"$work/up.log" || { cat "$work/up.log"; exit 1; }
"$bin/tandem-bench" --target "grpc://127.0.0.1:$port" "${workload[@]}" --num_requests 4 \
  --max_concurrency 1 --seed 1000 --progress=false >/dev/null
for rate in "${rates[@]}"; do
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" "${workload[@]}" --request_rate "$rate" \
    --seed "$rate" --progress=false --result_json "$work/real-$rate.json" >/dev/null
  "$bin/tandem-sim" --prefill 0 --decode 1 --shape stories15M --seq_len 2048 \
    --profile "$work/profile.json" "${workload[@]}" --request_rate "$rate" --seed "$rate" \
    --result_json "$work/sim-$rate.json" >/dev/null
  compare "colocated, $rate req/s" "$work/real-$rate.json" "$work/sim-$rate.json"
done
