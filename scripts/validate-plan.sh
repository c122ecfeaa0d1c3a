#!/usr/bin/env bash
# tandem-plan against measured runs: for each workload and SLO pair below,
# tandem-plan picks the cheapest deployment of at most two single-thread
# workers (this machine's cores) on a cost profile measured here and
# calibrated by the simulator's probe (scripts/sim-common.sh); then the
# chosen deployment and its two nearest rivals are each started for real
# (deploy/local/cluster.sh with the plan's own command-line flags) and sent
# the same requests by tandem-bench. Prints, and with --table FILE writes
# as Markdown, each one's predicted and measured TTFT and TPOT at p99 and
# goodput, and whether it met the SLOs. Not a test: it takes about ten
# minutes, and its figures depend on the machine.
#
#   scripts/validate-plan.sh [--table FILE] [REQUESTS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$root/build/bin}"
models="${TANDEM_MODELS:-$root/../shared/models}"
table=""
if [ "${1:-}" = "--table" ]; then
  table="$2"
  shift 2
fi
requests="${1:-100}"
work="$(mktemp -d /tmp/tandem-plan.XXXXXX)"
port=$((29000 + $$ % 2000))
last_cpu=$(($(nproc) - 1))
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$work/cluster"
trap '"$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# shellcheck source=scripts/sim-common.sh
. "$root/scripts/sim-common.sh"
sim_model_and_profile
up --prefill 0 --decode 1 --decode_cpus "$last_cpu" --threads 1
calibrate
rows="$work/rows.jsonl"

# validate LABEL SLO WORKLOAD_ARGS...: plans, then runs the chosen
# deployment and its rivals.
n=0
validate() {
  local label="$1" slo="$2"
  shift 2
  n=$((n + 1))
  "$bin/tandem-plan" --shape stories15M --seq_len 2048 --vocab_size 32000 \
    --profile "$work/profile1.json" "${calibration[@]}" --max_workers 2 \
    --chunk_tokens 128,256 --slo "$slo" --num_requests "$requests" "$@" \
    --plan_json "$work/plan-$n.json" >"$work/plan-$n.txt"
  sed -n '/^Chosen/,/^Run it/p' "$work/plan-$n.txt"
  # One line per deployment: role prefill decode decode_args prefill_args
  # router_args, tab-separated.
  python3 - "$work/plan-$n.json" >"$work/deployments-$n.tsv" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["plans"][0]
if "chosen" not in plan:
    sys.exit("tandem-plan found no deployment that meets the SLOs")
for role, i in [("chosen", plan["chosen"])] + [("rival", r) for r in plan["rivals"]]:
    p = plan["points"][i]
    print("\t".join([role, str(p["prefill"]), str(p["decode"]), p["decode_args"],
                     p["prefill_args"] or "-", p["router_args"]]))
PY
  local k=0
  while IFS=$'\t' read -r role prefill decode decode_args prefill_args router_args; do
    k=$((k + 1))
    local pin=(--decode_cpus "$last_cpu")
    [ "$prefill" = 0 ] && [ "$decode" = 2 ] && pin=()
    [ "$prefill" = 1 ] && pin=(--prefill_cpus 0 --decode_cpus "$last_cpu")
    local extra=()
    [ "$prefill_args" = "-" ] || extra=(--prefill_args "$prefill_args")
    up --prefill "$prefill" --decode "$decode" --threads 1 "${pin[@]}" \
      --decode_args "$decode_args" --router_args "$router_args" "${extra[@]}" </dev/null
    "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --vocab_size 32000 --slo "$slo" \
      --num_requests "$requests" "$@" --progress=false --result_json "$work/real-$n-$k.json" \
      </dev/null >/dev/null
    python3 - "$label" "$slo" "$role" "$k" "$work/plan-$n.json" "$work/real-$n-$k.json" \
      >>"$rows" <<'PY'
import json, sys
label, slo, role, k, plan_path, real_path = sys.argv[1:7]
plan = json.load(open(plan_path))["plans"][0]
ids = [plan["chosen"]] + plan["rivals"]
p = plan["points"][ids[int(k) - 1]]
real = json.load(open(real_path))["runs"][0]
targets = dict(kv.split("=") for kv in slo.split(","))
met = (real["failed"] == 0 and real["ttft_ms"]["p99"] <= float(targets["ttft"])
       and real["tpot_ms"]["p99"] <= float(targets["tpot"]))
print(json.dumps({"workload": label, "slo": slo, "role": role, "deployment": p["configuration"],
                  "predicted": {"ttft_p99": p["at_percentile_ms"]["ttft"],
                                "tpot_p99": p["at_percentile_ms"]["tpot"],
                                "goodput": p["goodput"], "meets": p["meets"]},
                  "measured": {"ttft_p99": real["ttft_ms"]["p99"], "tpot_p99": real["tpot_ms"]["p99"],
                               "goodput": real.get("request_goodput"), "failed": real["failed"],
                               "meets": met}}))
PY
    tail -1 "$rows"
  done <"$work/deployments-$n.tsv"
}

validate "prefill-heavy: 768 +-50% in, 32 out, 2.5 req/s" "ttft=600,tpot=30" \
  --dataset synthetic --input_len 768 --output_len 32 --range_ratio 0.5 --request_rate 2.5 \
  --seed 71
validate "chat: 256 +-50% in, 96 out, 4 req/s" "ttft=150,tpot=15" \
  --dataset synthetic --input_len 256 --output_len 96 --range_ratio 0.5 --request_rate 4 --seed 72

python3 - "$rows" "$table" "${calibration[*]}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = ["| workload, SLO p99 (ms) | deployment | TTFT p99 predicted / measured | "
       "TPOT p99 predicted / measured | goodput req/s predicted / measured | meets SLOs predicted / measured |",
       "|---|---|---:|---:|---:|---|"]
yes = lambda b: "yes" if b else "no"
for r in rows:
    p, m = r["predicted"], r["measured"]
    out.append(f"| {r['workload']}, {r['slo']} | {r['role']}: {r['deployment']} | "
               f"{p['ttft_p99']:.1f} / {m['ttft_p99']:.1f} | {p['tpot_p99']:.1f} / {m['tpot_p99']:.1f} | "
               f"{p['goodput']:.2f} / {m['goodput'] or 0:.2f} | {yes(p['meets'])} / {yes(m['meets'])} |")
text = "\n".join(out) + f"\n\nCalibration: {sys.argv[3]}\n"
print(text)
if sys.argv[2]:
    open(sys.argv[2], "w").write(text)
PY
