#!/usr/bin/env bash
# The official OpenAI SDK for Node (npm package `openai`) against a real
# local cluster: deploy/local/cluster.sh starts a router with an API key, one
# prefill and one decode worker; a second router over the same workers runs
# with --max_inflight=1 and no queue for the 429 check. openai_sdk_conformance.mjs runs
# the checks. The SDK is installed into CACHE_DIR/npm-openai on first use.
# Usage: openai_sdk_test.sh BIN_DIR MODELS_DIR CACHE_DIR
set -uo pipefail
bin="$1"
models="${TANDEM_MODELS:-$2}"
cache="$3/npm-openai"
root="$(cd "$(dirname "$0")/../.." && pwd)"
sdk_version=5.7.0
# Beside it, for the structured-output checks: zod (the SDK's parse()
# helper takes zod schemas) and ajv (validates every output).
packages=("openai@$sdk_version" zod@3.25.76 ajv@8.20.0)
tmp=$(mktemp -d)
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$tmp/cluster" TANDEM_MODELS="$models"
# Below the ephemeral range (32768+), in a band of its own beside cluster_cli's
# (metrics use port+1000..port+1220).
port=$((24000 + ($$ % 50) * 20))
limited_pid=""
cleanup() {
  [ -n "$limited_pid" ] && kill -TERM "$limited_pid" 2>/dev/null && wait "$limited_pid" 2>/dev/null
  "$root/deploy/local/cluster.sh" down >/dev/null 2>&1
  [ -z "${tools_cluster:-}" ] ||
    TANDEM_CLUSTER_DIR="$tools_cluster" "$root/deploy/local/cluster.sh" down >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/cluster/*.log "$tmp"/limited.log; do
    [ -f "$f" ] && { echo "---- $f"; tail -n 20 "$f"; }
  done
  exit 1
}

if [ ! -f "$models/stories260K.bin" ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from $models"; fi
  echo "SKIP: fixtures not found in $models"; exit 0
fi
for program in node npm; do
  command -v "$program" >/dev/null ||
    fail "$program is not in PATH (scripts/install-deps.sh installs nodejs and npm)"
done

# The packages, pinned; reinstalled when the cache holds other versions.
installed=""
for p in "${packages[@]}"; do
  name=${p%@*}
  installed+="$name@$(node -p "require('$cache/node_modules/$name/package.json').version" 2>/dev/null) "
done
if [ "$installed" != "${packages[*]} " ]; then
  mkdir -p "$cache" || fail "cannot create $cache"
  timeout 180 npm install --prefix "$cache" --no-audit --no-fund --no-save "${packages[@]}" \
    >"$cache/install.log" 2>&1 ||
    fail "npm install ${packages[*]} into $cache failed (network or registry?):
$(tail -n 20 "$cache/install.log")"
fi

key="tandem-sdk-test-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
"$root/deploy/local/cluster.sh" up --port "$port" --prefill 1 --decode 1 \
  --router_args "--api_key $key" 2>"$tmp/up.err" || fail "up: $(cat "$tmp/up.err")"

# A second router over the same workers, admitting one request at a time.
"$bin/tandem-router" --listen "127.0.0.1:$((port + 2))" --http_listen "127.0.0.1:$((port + 3))" \
  --http_port_file "$tmp/limited.port" --tokenizer "$models/tok512.bin" \
  --served_model_name stories260K.bin --prefill_workers "127.0.0.1:$((port + 100))" \
  --decode_workers "127.0.0.1:$((port + 200))" --max_inflight 1 --max_queued 0 --api_key "$key" \
  >"$tmp/limited.log" 2>&1 &
limited_pid=$!
deadline=$((SECONDS + 60))
until [ -s "$tmp/limited.port" ]; do
  kill -0 "$limited_pid" 2>/dev/null || fail "the --max_inflight=1 router exited"
  [ "$SECONDS" -lt "$deadline" ] || fail "the --max_inflight=1 router did not start within 60 s"
  sleep 0.1
done

timeout 100 node "$root/tests/e2e/openai_sdk_conformance.mjs" "$cache/node_modules" \
  "http://127.0.0.1:$((port + 1))/v1" "$key" "http://127.0.0.1:$((port + 3))/v1" \
  >"$tmp/node.out" 2>&1
rc=$?
cat "$tmp/node.out"
[ "$rc" -eq 0 ] || fail "the SDK checks failed (exit $rc)"

timeout 200 node "$root/tests/e2e/openai_structured_outputs.mjs" "$cache/node_modules" \
  "http://127.0.0.1:$((port + 1))/v1" "$key" >"$tmp/structured.out" 2>&1
rc=$?
cat "$tmp/structured.out"
[ "$rc" -eq 0 ] || fail "the structured-output checks failed (exit $rc)"

# Tool calls need a template that takes tools: stories260K as a model folder
# with the template of each family (Llama 3 JSON, Hermes, Mistral), with a
# 2,048-token context for their long tool prompts. No prefix caches: a prompt
# computed in pieces rounds differently from one computed whole, and the
# streamed call must equal the whole one.
for family in meta-llama-Llama-3.1-8B-Instruct Qwen-Qwen2.5-7B-Instruct \
  mistralai-Mistral-Nemo-Instruct-2407; do
  template="$models/chat_templates/$family.jinja"
  [ -f "$template" ] || fail "$template is missing"
  "$bin/tandem-convert" --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" \
    --seq_len 2048 --chat_template "$template" --output "$tmp/$family" \
    >"$tmp/convert.log" 2>&1 || fail "tandem-convert: $(tail -n 5 "$tmp/convert.log")"
  if [ "$family" = mistralai-Mistral-Nemo-Instruct-2407 ]; then
    # Mistral's calls start with its [TOOL_CALLS] control token: give the
    # tokenizer one, in place of the byte token <0x00>, which no text uses.
    node -e '
      const fs = require("fs");
      const t = JSON.parse(fs.readFileSync(process.argv[1]));
      delete t.model.vocab["<0x00>"];
      t.model.vocab["[TOOL_CALLS]"] = 3;
      t.added_tokens.push({ id: 3, content: "[TOOL_CALLS]", single_word: false, lstrip: false,
                            rstrip: false, normalized: false, special: true });
      fs.writeFileSync(process.argv[1], JSON.stringify(t));' "$tmp/$family/tokenizer.json" ||
      fail "cannot add [TOOL_CALLS] to $tmp/$family/tokenizer.json"
  fi
  tools_cluster="$tmp/cluster-$family"
  TANDEM_CLUSTER_DIR="$tools_cluster" "$root/deploy/local/cluster.sh" up \
    --port "$((port + 10))" --prefill 1 --decode 1 --model "$tmp/$family" \
    --router_args "--api_key $key" --prefill_args "--prefix_cache=false" \
    --decode_args "--prefix_cache=false" 2>"$tmp/up-tools.err" ||
    fail "up ($family): $(cat "$tmp/up-tools.err")"
  echo "# tool calls, $family's template"
  timeout 200 node "$root/tests/e2e/openai_tool_calls.mjs" "$cache/node_modules" \
    "http://127.0.0.1:$((port + 11))/v1" "$key" >"$tmp/tools.out" 2>&1
  rc=$?
  cat "$tmp/tools.out"
  [ "$rc" -eq 0 ] || fail "the tool-call checks failed with $family's template (exit $rc)"
  TANDEM_CLUSTER_DIR="$tools_cluster" "$root/deploy/local/cluster.sh" down >/dev/null 2>&1
  tools_cluster=""
done
echo "PASS"
