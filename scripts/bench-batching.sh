#!/usr/bin/env bash
# Continuous against static batching (a benchmark, not a test). Run after
# scripts/build.sh, on an otherwise idle machine.
#
#   scripts/bench-batching.sh [REQUESTS]
#
# REQUESTS requests (default 96), 32 at a time, 32-token prompts, output
# lengths uniform in [16, 256] (ignore_eos), stories15M-shaped model, one
# decode worker (colocated) with 2 threads. Continuous: a finished sequence's
# slot is refilled at once. Static: the client sends waves of 32 and the
# next only when the whole wave has ended (tandem-bench --waves), as a
# server without continuous batching runs them, in two forms:
#   - static, padded (--pad_waves): every row of a wave is computed until
#     its longest member ends, as a batch padded to its longest sequence is;
#     each request counts only its own tokens and ends at its own last one;
#   - static, shrinking: a finished row leaves the batch (this engine skips
#     it), so a wave wastes only the steps' fixed cost.
# Prints output tokens/s and mean latency from the start (waits included).
set -euo pipefail
requests="${1:-96}"
source "$(dirname "$0")/bench-common.sh" 24000
cluster_up --prefill 0 --decode 1 --threads 2

# All REQUESTS are there at the start: a request's latency counts from then
# (its wait for a slot or a wave included) to its last token.
printf "%-18s %14s %18s %14s\n" batching "output tok/s" "mean latency ms" "all done s"
for mode in continuous static-padded static-shrinking; do
  extra=()
  case "$mode" in
    static-padded) extra=(--waves --pad_waves) ;;
    static-shrinking) extra=(--waves) ;;
  esac
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --dataset synthetic --input_len 32 \
    --output_len 136 --range_ratio 0.88 --vocab_size 32000 --max_concurrency 32 \
    --num_requests "$requests" --seed 3 --progress=false --result_json "$work/$mode.json" \
    ${extra[@]+"${extra[@]}"} >/dev/null
  python3 - "$work/$mode.json" "$mode" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
rs = [r for r in m["runs"][0]["requests"] if r["success"]]
latency = sum(r["start"] + r["e2e"] for r in rs) / len(rs)
print("%-18s %14.1f %18.1f %14.2f" % (sys.argv[2], m["output_throughput"], 1e3 * latency,
                                      m["duration"]))
PY
done
