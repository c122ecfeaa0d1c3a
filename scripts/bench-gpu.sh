#!/usr/bin/env bash
# Benchmarks on an NVIDIA GPU (not tests). Run from the repository root of a
# build with CUDA (scripts/build.sh on a GPU host, or a build packed by
# scripts/gpu-bundle.sh and unpacked with `source scripts/gpu-env.sh`).
#
#   scripts/bench-gpu.sh [engine|cluster|all] [REQUESTS]
#
# engine:  tandem-engine-bench --backend cuda on the Llama-3-8B shape in
#          bf16: prefill of 2048 tokens against the cuBLAS bf16 GEMM rate,
#          decode at batch 1 and 32 against the HBM roofline, both limits
#          measured in the same run.
# cluster: a Llama-3-8B-shaped bf16 folder (random weights; the llama2
#          32,000-token vocabulary so that it serves with tokenizer.bin)
#          served on one GPU. First one 2048-token prompt at a time,
#          disaggregated (a prefill and a decode worker sharing the GPU):
#          the KV bytes shipped and the transfer time left after the
#          prefill's last layer, from the router's request log. Then the
#          same Poisson load (1024-token prompts, 128 output tokens)
#          disaggregated and colocated (one decode worker that also
#          prefills): TTFT and TPOT.
set -euo pipefail
what="${1:-all}"
requests="${2:-40}"
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/bin"
models="${TANDEM_MODELS:-$root/../shared/models}"

if [[ "$what" == engine || "$what" == all ]]; then
  "$bin/tandem-engine-bench" --backend cuda --shapes llama3-8b --dtype bf16 --prompts 2048 \
    --batches 1,32 --decode_prompt 1024 --decode_steps 32 --repeats 3
fi
[[ "$what" == cluster || "$what" == all ]] || exit 0

work="$(mktemp -d /dev/shm/tandem-bench-gpu.XXXXXX)"
port=$((24000 + $$ % 5000))
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$work/cluster"
trap '"$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
# TANDEM_BENCH_SHAPE=stories15M TANDEM_BENCH_BACKEND=cpu rehearses the
# cluster part on a machine without a GPU.
shape="${TANDEM_BENCH_SHAPE:-llama3-8b}"
model="$work/$shape"
"$bin/tandem-convert" --synthetic "$shape" --vocab_size 32000 --seq_len 4096 \
  --tokenizer "$models/tokenizer.bin" --dtype bf16 --output "$model"
# Both workers share the GPU: each sizes its KV pool from its own share.
gpu=(--backend=cuda --device=0 --gpu_memory_fraction=0.45)
solo=(--backend=cuda --device=0 --gpu_memory_fraction=0.9)
if [[ "${TANDEM_BENCH_BACKEND:-cuda}" == cpu ]]; then gpu=(--backend=cpu) solo=(--backend=cpu); fi
cluster_up() {
  "$root/deploy/local/cluster.sh" up --port "$port" --model "$model" "$@" \
    >/dev/null 2>>"$work/cluster.log" || { cat "$work/cluster.log" >&2; exit 1; }
}
cluster_down() { "$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true; }
bench() {  # bench RESULT_JSON ARGS...
  local out=$1
  shift
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --dataset synthetic --range_ratio 0 \
    --vocab_size 32000 --progress=false --result_json "$out" "$@" >/dev/null
}
summary() {  # summary FILE METRIC -> "p50 p99"
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))[sys.argv[2]]; print("%.1f %.1f" % (m["median"], m["p99"]))' "$1" "$2"
}

echo "== KV transfer of 2048-token prompts, prefill and decode workers on one GPU"
cluster_up --prefill 1 --decode 1 --prefill_args "${gpu[*]}" --decode_args "${gpu[*]}"
bench "$work/warm.json" --input_len 2048 --output_len 2 --max_concurrency 1 --num_requests 2 --seed 7
: >"$TANDEM_CLUSTER_DIR/requests.jsonl"
bench "$work/transfer.json" --input_len 2048 --output_len 2 --max_concurrency 1 --num_requests 8 \
  --seed 8
python3 - "$TANDEM_CLUSTER_DIR/requests.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r["status"] == "ok" and r["disaggregated"]]
if not rows:
    sys.exit("no disaggregated request in the log")
kv = statistics.median(r["kv_bytes"] for r in rows)
prefill = statistics.median(r["timeline_us"]["prefill"] for r in rows)
tail = statistics.median(r["timeline_us"]["kv_transfer"] for r in rows)
print(f"requests {len(rows)}, KV shipped {kv / 2**20:.1f} MiB each")
print(f"prefill (compute + transfer) p50 {prefill / 1e3:.2f} ms; transfer left after the "
      f"last layer p50 {tail / 1e3:.2f} ms")
if tail > 0:
    print(f"KV bytes over the tail: {kv / tail / 1e3:.2f} GB/s")
PY
cluster_down

echo "== Same load, disaggregated and colocated on one GPU ($requests requests at 4/s)"
printf "%-34s %9s %9s %10s %10s\n" layout "TTFT p50" "TTFT p99" "TPOT p50" "TPOT p99"
run() {  # run LABEL CLUSTER_ARGS...
  local label=$1
  shift
  cluster_up "$@"
  bench "$work/warm.json" --input_len 64 --output_len 4 --max_concurrency 1 --num_requests 2 \
    --seed 3
  bench "$work/load.json" --input_len 1024 --output_len 128 --request_rate 4 \
    --num_requests "$requests" --seed 4
  cluster_down
  read -r ttft50 ttft99 < <(summary "$work/load.json" ttft_ms)
  read -r tpot50 tpot99 < <(summary "$work/load.json" tpot_ms)
  printf "%-34s %9s %9s %10s %10s\n" "$label" "$ttft50" "$ttft99" "$tpot50" "$tpot99"
}
run "disaggregated, 1 prefill + 1 decode" --prefill 1 --decode 1 --prefill_args "${gpu[*]}" \
  --decode_args "${gpu[*]}"
run "colocated, 1 decode worker" --prefill 0 --decode 1 \
  --decode_args "${solo[*]}"
