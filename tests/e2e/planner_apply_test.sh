#!/usr/bin/env bash
# tandem-planner in apply mode on a local cluster: a burst of requests makes
# it grow the pools (deploy/local/cluster.sh scale starts and lists
# workers), the calm after it shrinks them back (unlisted, drained,
# stopped) while light traffic keeps coming, and no request fails. Every
# change it decided was applied, and the cluster ends as its last decision
# says.
# Usage: planner_apply_test.sh BIN_DIR MODELS_DIR
set -uo pipefail
bin="$1"
models="${TANDEM_MODELS:-$2}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp=$(mktemp -d)
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$tmp/cluster" TANDEM_MODELS="$models"
port=$((21000 + ($$ % 50) * 20))  # metrics use port+1000..port+1220
planner_pid=""
cleanup() {
  [ -z "$planner_pid" ] || kill "$planner_pid" 2>/dev/null
  "$root/deploy/local/cluster.sh" down >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "---- decisions"; cat "$tmp/decisions.jsonl" 2>/dev/null
  for f in "$tmp"/planner.log "$tmp"/cluster/*.log; do echo "---- $f"; tail -n 15 "$f"; done
  exit 1
}

if [ ! -f "$models/stories260K.bin" ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from $models"; fi
  echo "SKIP: fixtures not found in $models"; exit 0
fi

"$root/deploy/local/cluster.sh" up --port "$port" --prefill 0 --decode 1 2>"$tmp/up.err" ||
  fail "up: $(cat "$tmp/up.err")"
# Colocated on one worker up to 1 req/s; one prefill and two decode
# workers up to 5 (and proportionally more past it).
cat >"$tmp/plan.json" <<'JSON'
{"plans": [{"request_rate": 1, "chosen": 0, "points": [{"prefill": 0, "decode": 1}]},
           {"request_rate": 5, "chosen": 0, "points": [{"prefill": 1, "decode": 2}]}]}
JSON
"$bin/tandem-planner" --router_metrics "127.0.0.1:$((port + 1000))" --plan "$tmp/plan.json" \
  --interval 1s --horizon 0s --forecast constant --cooldown 1s --scale_down_delay 3s \
  --max_prefill 2 --max_decode 3 --mode apply \
  --apply_command "$root/deploy/local/cluster.sh scale --prefill {prefill} --decode {decode}" \
  --decisions_log "$tmp/decisions.jsonl" >"$tmp/planner.log" 2>&1 &
planner_pid=$!

bench() {  # bench NAME RATE REQUESTS
  "$bin/tandem-bench" --target "grpc://127.0.0.1:$port" --vocab_size 512 --dataset synthetic \
    --input_len 64 --output_len 32 --request_rate "$2" --num_requests "$3" --seed "$3" \
    --progress=false --result_json "$tmp/$1.json" >/dev/null 2>&1 || fail "tandem-bench $1 failed"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; sys.exit(r['failed'])" \
    "$tmp/$1.json" || fail "$1: requests failed"
}
# wait_for PYTHON_CONDITION: until the decisions satisfy it (d: the list).
wait_for() {
  for _ in $(seq 1 600); do
    python3 - "$tmp/decisions.jsonl" "$1" <<'PY' && return 0
import json, sys
try:
    d = [json.loads(l) for l in open(sys.argv[1])]
except FileNotFoundError:
    d = []
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
    sleep 0.1
  done
  fail "the planner never reached: $1"
}

wait_for "len(d) >= 1"
bench burst 10 80
wait_for "any(x['changed'] and x['target'][0] >= 1 for x in d)"
bench calm 0.5 10
wait_for "[x for x in d if x['changed']][-1]['target'] == [0, 1]"
kill "$planner_pid"
wait "$planner_pid" || fail "tandem-planner exited with $?"
planner_pid=""

python3 - "$tmp/decisions.jsonl" <<'PY' || fail "the decisions were not all applied"
import json, sys
d = [json.loads(l) for l in open(sys.argv[1])]
changes = [x for x in d if x["changed"]]
bad = [x for x in changes if x.get("applied") != "ok"]
assert not bad, bad
# It grew to 1 prefill and 2 decode workers or more, and ended colocated.
assert max(x["target"][0] for x in changes) >= 1 and max(x["target"][1] for x in changes) >= 2
assert changes[-1]["target"] == [0, 1]
PY
"$root/deploy/local/cluster.sh" status >"$tmp/status"
[ "$(grep -c '^decode-.*running' "$tmp/status")" -eq 1 ] && ! grep -q '^prefill-' "$tmp/status" ||
  fail "the cluster is not at the last decision's 0 prefill and 1 decode workers: $(cat "$tmp/status")"
[ "$(grep -c . "$tmp/cluster/decode.targets")" -eq 1 ] || fail "decode.targets lists $(cat "$tmp/cluster/decode.targets")"
echo "PASS: the planner grew and shrank the pools; $(grep -c '"changed": *true' "$tmp/decisions.jsonl") changes, no request failed"
