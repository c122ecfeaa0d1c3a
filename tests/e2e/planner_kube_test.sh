#!/usr/bin/env bash
# tandem-planner's Kubernetes apply mode, the binary end to end against
# fakes (planner_kube_fake.py): two router replicas at 4 and 5 requests a
# second, and the API's scale subresource of the two pool Deployments. The
# planner must add the routers (9 req/s, which the plan maps to 2 prefill
# and 3 decode workers; neither router alone reaches it), read the
# Deployments' sizes at start, and PATCH each to the plan's size through
# the scale subresource, with no other request. Pools shrink at once
# (--scale_down_delay 0s): on a loaded machine a first reading taken over a
# skewed interval can overshoot, and the next ones must bring the pools back
# to the plan's size within the run.
# Usage: planner_kube_test.sh BIN_DIR
set -uo pipefail
bin="$1"
here="$(cd "$(dirname "$0")" && pwd)"
tmp=$(mktemp -d)
fake_pid=""
cleanup() {
  [ -z "$fake_pid" ] || kill "$fake_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "---- state"; cat "$tmp/state.json" 2>/dev/null
  echo "---- decisions"; cat "$tmp/decisions.jsonl" 2>/dev/null
  echo "---- planner"; tail -n 20 "$tmp/planner.log"
  exit 1
}

python3 "$here/planner_kube_fake.py" "$tmp/ports" "$tmp/state.json" &
fake_pid=$!
for _ in $(seq 1 100); do [ -s "$tmp/ports" ] && break; sleep 0.1; done
read -r router_a router_b api <"$tmp/ports" || fail "the fakes did not start"

cat >"$tmp/plan.json" <<'JSON'
{"plans": [{"request_rate": 5, "chosen": 0, "points": [{"prefill": 1, "decode": 1}]},
           {"request_rate": 10, "chosen": 0, "points": [{"prefill": 2, "decode": 3}]}]}
JSON
timeout 60 "$bin/tandem-planner" --router_metrics "127.0.0.1:$router_a,localhost:$router_b" \
  --plan "$tmp/plan.json" --mode apply --kube_api "http://127.0.0.1:$api" \
  --kube_namespace serving --kube_deployments prefill=tandem-prefill,decode=tandem-decode \
  --interval 1s --cooldown 0s --scale_down_delay 0s --forecast constant --horizon 0s \
  --run_for 6s \
  --decisions_log "$tmp/decisions.jsonl" >"$tmp/planner.log" 2>&1 ||
  fail "tandem-planner exited with $?"
grep -q "the pools start at 1 prefill and 1 decode" "$tmp/planner.log" ||
  fail "the planner did not start from the Deployments' sizes"
[ -f "$tmp/state.json" ] || fail "the planner patched nothing"
python3 - "$tmp/state.json" "$tmp/decisions.jsonl" <<'PY' || fail "see above"
import json, sys
state = json.load(open(sys.argv[1]))
decisions = [json.loads(l) for l in open(sys.argv[2])]
problems = []
if state["bad"]:
    problems.append(f"requests outside the two Deployments' scale: {state['bad']}")
if state["replicas"] != {"tandem-prefill": 2, "tandem-decode": 3}:
    problems.append(f"the Deployments end at {state['replicas']}, not 2 prefill and 3 decode")
rates = sorted(d["rate"] for d in decisions if d["rate"] > 0)
if not rates or abs(rates[len(rates) // 2] - 9) > 1:
    problems.append(f"observed rates {rates}: the two routers add up to 9 req/s")
if not any(d.get("applied") == "ok" for d in decisions):
    problems.append("no decision was applied")
if any(d.get("applied", "ok") != "ok" for d in decisions):
    problems.append("an apply failed")
if max(d["ready"][1] for d in decisions) != 3:
    problems.append("ready decode workers should be the most any router reports (3)")
print("\n".join(problems) or f"ok: {len(decisions)} decisions, patches {state['patches']}")
sys.exit(1 if problems else 0)
PY
echo "PASS: the planner scaled both Deployments through the API for the routers' summed load"
