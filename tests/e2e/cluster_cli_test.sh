#!/usr/bin/env bash
# The README's main job as a user runs it: deploy/local/cluster.sh starts a
# router, two prefill and two decode workers; tandem-cli streams a story
# through them, and the text equals what tandem-generate prints in one
# process. Then the cluster stops cleanly.
# Usage: cluster_cli_test.sh BIN_DIR MODELS_DIR
set -uo pipefail
bin="$1"
models="${TANDEM_MODELS:-$2}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp=$(mktemp -d)
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$tmp/cluster" TANDEM_MODELS="$models"
# Below the ephemeral range (32768+), so that no outgoing connection holds it.
port=$((20000 + ($$ % 50) * 20))  # metrics use port+1000..port+1220
cleanup() { "$root/deploy/local/cluster.sh" down >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/cluster/*.log; do echo "---- $f"; tail -n 20 "$f"; done
  exit 1
}

if [ ! -f "$models/stories260K.bin" ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from $models"; fi
  echo "SKIP: fixtures not found in $models"; exit 0
fi

"$root/deploy/local/cluster.sh" up --port "$port" 2>"$tmp/up.err" || fail "up: $(cat "$tmp/up.err")"
"$root/deploy/local/cluster.sh" status >"$tmp/status" || fail "status failed"
[ "$(grep -c running "$tmp/status")" -eq 5 ] || fail "status shows $(cat "$tmp/status")"
"$root/deploy/local/cluster.sh" up --port "$port" 2>"$tmp/twice.err" && fail "a second up succeeded"
grep -q "already running" "$tmp/twice.err" || fail "second up said: $(cat "$tmp/twice.err")"

m=(--model "$models/stories260K.bin" --tokenizer "$models/tok512.bin")
for prompt in "Once upon a time" "The cat sat on the mat and"; do
  "$bin/tandem-cli" generate --router "127.0.0.1:$port" --prompt "$prompt" --max-tokens 200 \
    >"$tmp/cluster.txt" 2>"$tmp/cli.err" || fail "tandem-cli: $(cat "$tmp/cli.err")"
  "$bin/tandem-generate" "${m[@]}" --prompt "$prompt" --max-tokens 200 >"$tmp/local.txt" 2>/dev/null ||
    fail "tandem-generate failed"
  cmp -s "$tmp/cluster.txt" "$tmp/local.txt" ||
    fail "cluster text differs for '$prompt':
cluster: $(cat "$tmp/cluster.txt")
local:   $(cat "$tmp/local.txt")"
done
grep -qi "ttft" "$tmp/cli.err" || fail "no summary on stderr: $(cat "$tmp/cli.err")"

# The OpenAI-compatible HTTP API on port+1 gives the same greedy text.
curl -sS -o "$tmp/http.json" "http://127.0.0.1:$((port + 1))/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"prompt": "The cat sat on the mat and", "max_tokens": 200, "temperature": 0}' ||
  fail "HTTP completion failed"
python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))["choices"][0]["text"])' \
  "$tmp/http.json" >"$tmp/http.txt" || fail "HTTP answer: $(cat "$tmp/http.json")"
cmp -s "$tmp/http.txt" "$tmp/local.txt" || fail "HTTP text differs: $(cat "$tmp/http.txt")"
code=$(curl -s -o "$tmp/bad.json" -w '%{http_code}' "http://127.0.0.1:$((port + 1))/v1/completions" \
  -H 'Content-Type: application/json' -d '{"prompt": "Hi", "max_tokens": -1}')
[ "$code" = 400 ] && grep -q max_tokens "$tmp/bad.json" || fail "bad request gave $code: $(cat "$tmp/bad.json")"

"$bin/tandem-cli" generate --router "127.0.0.1:$port" --prompt "Hi" --max-tokens -1 \
  >"$tmp/out" 2>"$tmp/err" && fail "--max-tokens -1 succeeded"
grep -q "max_tokens" "$tmp/err" || fail "--max-tokens -1 said: $(cat "$tmp/err")"

"$root/deploy/local/cluster.sh" down 2>"$tmp/down.err" || fail "down failed"
grep -q "stopped (5 processes)" "$tmp/down.err" || fail "down said: $(cat "$tmp/down.err")"
grep -q "did not drain" "$tmp/down.err" && fail "a process had to be killed"
echo "PASS"
