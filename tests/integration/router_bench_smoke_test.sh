#!/usr/bin/env bash
# tandem-router-bench runs end to end at tiny sizes against the real router
# and prints figures that make sense (its real run is too heavy for the test
# suite).
# Usage: router_bench_smoke_test.sh PATH/TO/tandem-router-bench PATH/TO/tandem-router MODELS_DIR
set -uo pipefail
bench="$1"
router="$2"
models="$3"
fail() { echo "FAIL: $*"; exit 1; }
[ -f "$models/tok512.bin" ] || { echo "SKIP: no $models/tok512.bin"; exit 0; }
log=$(mktemp /tmp/router_bench_smoke.XXXXXX.log)
trap 'rm -f "$log"' EXIT

for mode in colocated disaggregated; do
  extra=()
  [ "$mode" = disaggregated ] && extra=(--disaggregated)
  out=$(timeout 120 "$bench" --router "$router" --tokenizer "$models/tok512.bin" --quick \
    --router_log "$log" "${extra[@]}" 2>&1) || fail "$mode run failed: $out"
  json=$(grep '^{"bench":"router_bench"' <<<"$out") || fail "no JSON line in: $out"
  python3 - "$json" "$mode" <<'PY' || fail "$mode figures: $json"
import json, sys
r = json.loads(sys.argv[1])
assert r["disaggregated"] == (sys.argv[2] == "disaggregated"), r
t = r["throughput"]
assert t["errors"] == 0 and t["drained"] and t["completed"] > 0, t
assert t["streams_per_s"] > 0 and t["router_cpu_s"] > 0 and t["streams_per_cpu_s"] > 0, t
m = r["memory"]
assert m["streams"] == 20 and m["open"] == 20 and m["errors"] == 0 and m["drained"], m
assert m["rss_before_kb"] > 0 and m["rss_open_kb"] > 0, m
s = r["ttft"]
for side in ("direct", "routed"):
    x = s[side]
    assert x["errors"] == 0 and x["drained"] and x["samples"] == x["sent"] > 0, x
    assert 0 < x["p50_us"] <= x["p99_us"], x
PY
  grep -q "new streams/s per core" <<<"$out" || fail "no table in: $out"
  grep -q "memory per open stream (20 open)" <<<"$out" || fail "no memory row in: $out"
done

# Bad input is a clear error, and a router that cannot start is reported.
err=$("$bench" --router "$router" --phases speed 2>&1) && fail "--phases speed accepted"
grep -q "unknown phase 'speed'" <<<"$err" || fail "--phases error says: $err"
err=$("$bench" --router /nonexistent/tandem-router 2>&1) && fail "missing router accepted"
grep -q "is not an executable file" <<<"$err" || fail "missing router error says: $err"
err=$(timeout 60 "$bench" --router "$router" --tokenizer /nonexistent/tok.bin --quick \
  --router_log "$log" 2>&1) && fail "a router that cannot start was accepted"
grep -q "before serving" <<<"$err" || fail "router start failure says: $err"
echo "PASS"
