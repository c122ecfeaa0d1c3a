#!/usr/bin/env bash
# Simulated against measured: the same workload through a real local
# cluster (deploy/local/cluster.sh, tandem-bench) and through tandem-sim on
# cost profiles measured on this machine (tandem-profile), side by side,
# with the error of each figure. Its full run is not a test: it takes about
# ten minutes and its figures depend on the machine.
#
#   scripts/validate-sim.sh [--check] [--table FILE] [REQUESTS]
#
# The full run: eleven configurations (colocated with one worker of one
# thread at three loads and under each schedule policy; shared-prefix and
# multi-turn workloads; a replay of the router's own request log; one worker
# of two threads; two workers of one thread; one prefill and one decode
# worker pinned to a core each), REQUESTS requests each (60 by default),
# each measured twice (the same requests at the same times on fresh
# clusters: how far the two runs differ is how far this machine repeats
# itself) and simulated once,
# and a Markdown table of them in FILE with --table.
#
# --check (the ctest `sim_validation`): one light load only, and exit 1 when
# a median or the throughput is off by more than bounds wide enough for a
# loaded machine (TTFT and TPOT medians 50%, throughput 15%), so that the
# simulator cannot drift far from the code it runs unnoticed.
#
# The model is a synthetic stories15M shape (random weights, bf16, context
# 2048). Workers with one thread are pinned to a CPU where the
# configuration says so; the router and the client share the machine with
# them. The profiles are measured on the same weights: one thread pinned to
# the last CPU, and two threads.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
models="${TANDEM_MODELS:-$root/../shared/models}"
check=0
table=""
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=1; shift ;;
    --table) table="$2"; shift 2 ;;
    *) break ;;
  esac
done
requests="${1:-60}"
work="$(mktemp -d /tmp/tandem-validate.XXXXXX)"
port=$((27000 + $$ % 2000))
last_cpu=$(($(nproc) - 1))
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$work/cluster"
trap '"$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# shellcheck source=scripts/sim-common.sh
. "$root/scripts/sim-common.sh"
sim_model_and_profile
if [ "$check" = 0 ]; then
  "$bin/tandem-profile" --model "$work/model" --threads 2 --output "$work/profile2.json" | tail -1
fi

slo="ttft=100,tpot=10"
rows="$work/rows.jsonl"

# compare LABEL SIM REAL...: prints each figure simulated against the mean
# of the measured runs, with the error and (with two runs) how far the two
# runs lie apart (their difference over their mean: the measurement's own
# repeatability), appends them to $rows, and (with --check) fails on drift.
compare() {
  python3 - "$check" "$rows" "$@" <<'PY'
import json, sys
check, rows_path, label, sim, reals = sys.argv[1] == "1", sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
s = json.load(open(sim))["runs"][0]
rs = [json.load(open(r))["runs"][0] for r in reals]
get = {"TTFT p50 ms": lambda m: m["ttft_ms"]["median"], "TTFT p99 ms": lambda m: m["ttft_ms"]["p99"],
       "TPOT p50 ms": lambda m: m["tpot_ms"]["median"], "TPOT p99 ms": lambda m: m["tpot_ms"]["p99"],
       "ITL p99 ms": lambda m: m["itl_ms"]["p99"], "output tok/s": lambda m: m["output_throughput"],
       "goodput req/s": lambda m: m.get("request_goodput")}
bounds = {"TTFT p50 ms": 50, "TPOT p50 ms": 50, "output tok/s": 15}
failed = []
with open(rows_path, "a") as out:
    for name, f in get.items():
        measured = [f(r) for r in rs]
        b = f(s)
        if b is None or any(a is None for a in measured):
            continue
        a = sum(measured) / len(measured)
        err = (b - a) / a * 100 if a else float("nan")
        spread = abs(measured[0] - measured[1]) / a * 100 if len(measured) > 1 and a else None
        runs = " / ".join(f"{x:.2f}" for x in measured)
        note = f"  (runs {runs}, {spread:.0f}% apart)" if spread is not None else ""
        print(f"{label:38s} {name:13s} {a:10.2f} {b:10.2f} {err:+7.1f}%{note}")
        out.write(json.dumps({"config": label, "figure": name, "measured": measured,
                              "simulated": b, "error": err, "spread": spread}) + "\n")
        if check and name in bounds and not abs(err) <= bounds[name]:
            failed.append(f"{name} off by {err:+.1f}% (bound {bounds[name]}%)")
if failed:
    print("FAIL: the simulation drifted from the measured run: " + "; ".join(failed))
    sys.exit(1)
PY
}

# pair LABEL "SIM_ARGS" WORKLOAD_ARGS...: the workload measured on the
# cluster that is up (in the full run twice, the same requests at the same
# times, the second time on a fresh cluster of the same flags), then
# simulated with SIM_ARGS, then compared.
n=0
pair() {
  local label="$1" reals=() sim_args=()
  eval "sim_args=($2)"  # Quoted words stay whole.
  shift 2
  n=$((n + 1))
  for run in $(seq "$((2 - check))"); do
    # The same prompts again would find the first run's blocks cached.
    [ "$run" = 1 ] || up "${up_args[@]}"
    "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --vocab_size 32000 --slo "$slo" \
      --num_requests "$requests" "$@" --progress=false --result_json "$work/real-$n-$run.json" \
      >/dev/null
    reals+=("$work/real-$n-$run.json")
  done
  "$bin/tandem-sim" --shape stories15M --seq_len 2048 --vocab_size 32000 --slo "$slo" \
    "${calibration[@]}" --num_requests "$requests" "${sim_args[@]}" "$@" \
    --result_json "$work/sim-$n.json" >/dev/null
  compare "$label" "$work/sim-$n.json" "${reals[@]}"
}

one=(--prefill 0 --decode 1 --decode_cpus "$last_cpu" --threads 1)
sim_one="--prefill 0 --decode 1 --profile $work/profile1.json"
up "${one[@]}"
calibrate
printf "%-38s %-13s %10s %10s %8s\n" configuration figure measured simulated error
if [ "$check" = 1 ]; then
  pair "colocated 1x1, 2 req/s" "$sim_one" "${uniform[@]}" --request_rate 2 --seed 2
  exit 0
fi

pair "colocated 1x1, 1 req/s (light)" "$sim_one" "${uniform[@]}" --request_rate 1 --seed 1
up "${one[@]}"
pair "colocated 1x1, 3 req/s (half)" "$sim_one" "${uniform[@]}" --request_rate 3 --seed 3
# Its first run's log (after the warm-up's 4 requests) is replayed below.
sed -n "5,$((4 + requests))p" "$TANDEM_CLUSTER_DIR/requests.jsonl" >"$work/replay.jsonl"
up "${one[@]}"
pair "colocated 1x1, 6 req/s (near saturation)" "$sim_one" "${uniform[@]}" --request_rate 6 \
  --seed 6
for policy in chunked prefill_first; do
  up "${one[@]}" --decode_args "--schedule_policy $policy --prefill_chunk_tokens 128"
  pair "colocated 1x1, $policy, 3 req/s" \
    "$sim_one --decode_args '--schedule_policy $policy --prefill_chunk_tokens 128'" \
    "${uniform[@]}" --request_rate 3 --seed 13
done
up "${one[@]}"
pair "colocated 1x1, shared prefix, 3 req/s" "$sim_one" --dataset shared_prefix \
  --num_prefixes 4 --prefix_len 192 --input_len 64 --output_len 64 --request_rate 3 --seed 23
up "${one[@]}"
pair "colocated 1x1, 3-turn chats, 1/s" "$sim_one" --dataset multi_turn --turns 3 \
  --think_time 0.5 --input_len 96 --output_len 32 --request_rate 1 --seed 33
up "${one[@]}"
pair "colocated 1x1, replayed log (3 req/s)" "$sim_one" --dataset request_log \
  --dataset_path "$work/replay.jsonl" --seed 43
up --prefill 0 --decode 1 --threads 2
pair "colocated 1x2 threads, 3 req/s" "--prefill 0 --decode 1 --profile $work/profile2.json" \
  "${uniform[@]}" --request_rate 3 --seed 53
up --prefill 0 --decode 2 --threads 1
pair "colocated 2x1, 6 req/s" "--prefill 0 --decode 2 --profile $work/profile1.json" \
  "${uniform[@]}" --request_rate 6 --seed 63
# KV over UCX's shared memory: about 10 GB/s on this host (docs/architecture.md,
# KV transfer).
up --prefill 1 --decode 1 --prefill_cpus 0 --decode_cpus "$last_cpu" --threads 1
pair "1P+1D pinned, 3 req/s" \
  "--prefill 1 --decode 1 --profile $work/profile1.json --link_bandwidth 10 --link_latency 20us" \
  "${uniform[@]}" --request_rate 3 --seed 73

if [ -n "$table" ]; then
  python3 - "$rows" "$table" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
figures = ["TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "ITL p99 ms",
           "output tok/s", "goodput req/s"]
configs = list(dict.fromkeys(r["config"] for r in rows))
by = {(r["config"], r["figure"]): r for r in rows}
with open(sys.argv[2], "w") as out:
    out.write("| configuration | " + " | ".join(figures) + " |\n")
    out.write("|---|" + "---:|" * len(figures) + "\n")
    for c in configs:
        cells = []
        for f in figures:
            r = by.get((c, f))
            if r is None:
                cells.append("")
                continue
            mean = sum(r["measured"]) / len(r["measured"])
            cell = f"{mean:.1f} / {r['simulated']:.1f} ({r['error']:+.0f}%"
            cell += f"; ±{r['spread'] / 2:.0f}%)" if r.get("spread") is not None else ")"
            cells.append(cell)
        out.write(f"| {c} | " + " | ".join(cells) + " |\n")
PY
  echo "table: $table"
fi
