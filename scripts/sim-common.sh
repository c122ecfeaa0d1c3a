# What scripts/validate-sim.sh and scripts/validate-plan.sh share: the
# synthetic stories15M model they serve, its cost profile, a fresh local
# cluster, and the probe that calibrates the simulator to it. Sourced with
# root, bin, models, work, port and last_cpu set, and TANDEM_BIN and
# TANDEM_CLUSTER_DIR exported.

uniform=(--dataset synthetic --range_ratio 0 --input_len 256 --output_len 64)

# The model (random weights, bf16, context 2048) and its profile of one
# thread pinned to the last CPU, measured on the very weights the workers
# serve.
sim_model_and_profile() {
  "$bin/tandem-convert" --synthetic stories15M --seq_len 2048 --tokenizer "$models/tokenizer.bin" \
    --output "$work/model" >/dev/null
  taskset -c "$last_cpu" "$bin/tandem-profile" --model "$work/model" --threads 1 \
    --output "$work/profile1.json" | tail -1
}

up_args=()
up() {  # up CLUSTER_ARGS...: a fresh cluster, warmed up.
  up_args=("$@")
  "$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$TANDEM_CLUSTER_DIR"
  "$root/deploy/local/cluster.sh" up --port "$port" --model "$work/model" "$@" >/dev/null \
    2>"$work/up.log" || { cat "$work/up.log"; exit 1; }
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" "${uniform[@]}" --vocab_size 32000 \
    --num_requests 4 --max_concurrency 1 --seed 1000 --progress=false >/dev/null
}

# The profile brought to the serving worker, by a probe on the colocated
# cluster of one worker before the first configuration: 10 lone requests of
# 16 prompt tokens and 32 output tokens, measured and simulated. The
# measured median TPOT over the simulated one scales every step of every
# configuration (--step_scale: the profile times steps alone on an idle
# core, the worker serves them beside its gRPC threads, the router and the
# client); the measured median TTFT less the simulated one (scaled) is the
# gRPC hops' latency (--hop_latency). The probe is not a workload compared
# below.
calibration=()
calibrate() {
  local probe=(--dataset synthetic --range_ratio 0 --input_len 16 --output_len 32
               --max_concurrency 1 --num_requests 10 --seed 99)
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --vocab_size 32000 "${probe[@]}" \
    --progress=false --result_json "$work/probe-real.json" >/dev/null
  "$bin/tandem-sim" --shape stories15M --seq_len 2048 --vocab_size 32000 "${probe[@]}" \
    --prefill 0 --decode 1 --profile "$work/profile1.json" --result_json "$work/probe-sim.json" \
    >/dev/null
  read -r -a calibration < <(python3 - "$work/probe-real.json" "$work/probe-sim.json" <<'PY'
import json, sys
real, sim = [json.load(open(p))["runs"][0] for p in sys.argv[1:3]]
scale = real["tpot_ms"]["median"] / sim["tpot_ms"]["median"]
hop = max(0.0, real["ttft_ms"]["median"] - scale * sim["ttft_ms"]["median"])
print(f"--step_scale {scale:.3f} --hop_latency {hop * 1000:.0f}us")
PY
)
  echo "calibration: ${calibration[*]} (a probe of lone requests, measured against simulated)"
}

