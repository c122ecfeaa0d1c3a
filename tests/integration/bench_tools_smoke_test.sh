#!/usr/bin/env bash
# The benchmark tools run end to end at tiny sizes and print figures that
# make sense (their real runs are too slow for the test suite).
# Usage: bench_tools_smoke_test.sh PATH/TO/tandem-kvbench PATH/TO/tandem-engine-bench
#   PATH/TO/tandem-synth
set -uo pipefail
kvbench="$1"
engine_bench="$2"
fail() { echo "FAIL: $*"; exit 1; }

# Two lane counts, each without and with checksums (the default), 4 layers
# of 64 KiB, without ucx_perftest.
out=$(timeout 120 "$kvbench" --sizes 64KiB --layers 4 --transfers 5 --warmup 1 --repeats 1 \
  --lanes 1,2 --max_sends_in_flight 2 --perftest=false 2>&1) || fail "kvbench failed: $out"
json=$(grep '^{"bench":"kvbench"' <<<"$out") || fail "no JSON line in: $out"
python3 - "$json" <<'PY' || fail "kvbench figures: $json"
import json, sys
r = json.loads(sys.argv[1])
assert r["layers"] == 4 and len(r["results"]) == 4, r
assert sorted((row["lanes"], row["checksums"]) for row in r["results"]) == [
    (1, False), (1, True), (2, False), (2, True)], r
for row in r["results"]:
    assert row["size"] == 65536 and row["gbps"] > 0 and row["memcpy_gbps"] > 0, row
    assert 0 < row["p50_us"] <= row["p99_us"], row
    if row["checksums"]:
        assert row["vs_unchecked"] > 0, row
    else:
        assert row["vs_unchecked"] is None, row
PY
grep -q "memcpy, same layers" <<<"$out" || fail "no memcpy column: $out"
grep -q "sender's hashing (XXH3-64" <<<"$out" || fail "no sender hashing rate: $out"
err=$(timeout 30 "$kvbench" --checksums maybe --perftest=false 2>&1) && fail "--checksums maybe accepted"
grep -q "bad --checksums value 'maybe'" <<<"$err" || fail "--checksums maybe error says: $err"

# Bad input is a clear error.
err=$(timeout 30 "$kvbench" --max_sends_in_flight 0 --perftest=false 2>&1) && fail "window 0 accepted"
grep -q "max_sends_in_flight" <<<"$err" || fail "window 0 error says: $err"
err=$("$engine_bench" --backend tpu 2>&1) && fail "--backend tpu accepted"
grep -q "use cpu or cuda" <<<"$err" || fail "--backend tpu error says: $err"

# The engine benchmark on a tiny run of the CPU backend.
out=$(timeout 120 "$engine_bench" --shapes stories15M --prompts 16 --batches 1,2 \
  --decode_prompt 8 --decode_steps 4 --repeats 1 --threads 1 2>&1) || fail "engine bench: $out"
grep -q "decode batch 2: bandwidth limit" <<<"$out" || fail "no roofline line: $out"
grep -q '"backend":"cpu"' <<<"$out" || fail "no JSON line: $out"

# --model: a given file instead of the shapes; a bad one is refused.
err=$("$engine_bench" --model /nonexistent.gguf 2>&1) && fail "--model of no file accepted"
grep -q -- "--model:" <<<"$err" || fail "--model error says: $err"
synth="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$synth" --output "$tmp/m.gguf" --format gguf --gguf_type bf16 --seq_len 64 >/dev/null 2>&1 ||
  fail "tandem-synth failed"
out=$(timeout 120 "$engine_bench" --model "$tmp/m.gguf" --prompts 16 --batches 1 \
  --decode_prompt 8 --decode_steps 4 --repeats 1 --threads 1 2>&1) || fail "--model run: $out"
grep -q "m.gguf file  *decode batch 1: bandwidth limit" <<<"$out" || fail "no --model roofline: $out"
echo "PASS"
