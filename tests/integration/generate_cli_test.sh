#!/usr/bin/env bash
# tandem-generate as a user runs it: stdout carries only the continuation,
# and bad input ends with a message that says what to change.
# Usage: generate_cli_test.sh PATH/TO/tandem-generate MODELS_DIR PATH/TO/tandem-convert
set -uo pipefail
bin="$1"
models="${TANDEM_MODELS:-$2}"
convert="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

expect_error() {  # expect_error "message substring" args...
  local want="$1"; shift
  if "$bin" "$@" >"$tmp/out" 2>"$tmp/err"; then fail "'$*' succeeded"; fi
  grep -qF -- "$want" "$tmp/err" || fail "'$*' printed '$(cat "$tmp/err")', not '$want'"
  [ ! -s "$tmp/out" ] || fail "'$*' wrote to stdout: $(cat "$tmp/out")"
}

expect_error "--model is required"
expect_error "/nonexistent/model.bin" --model /nonexistent/model.bin
printf 'not a model' >"$tmp/junk.bin"
expect_error "junk.bin" --model "$tmp/junk.bin"
expect_error "unexpected argument 'stray'" --model x stray

if [ ! -f "$models/stories260K.bin" ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from $models"; fi
  echo "SKIP: fixtures not found in $models"; exit 0
fi
m=(--model "$models/stories260K.bin" --tokenizer "$models/tok512.bin")
expect_error "tokenizer" "${m[@]}" --tokenizer "$models/tokenizer.bin"
expect_error "top_p" "${m[@]}" --top-p 0
expect_error "temperature" "${m[@]}" --temperature -1
expect_error "min_p" "${m[@]}" --min-p 2
expect_error "use cpu or cuda" "${m[@]}" --backend tpu
long=$(printf 'word %.0s' $(seq 600))
expect_error "context" "${m[@]}" --prompt "$long"

"$bin" "${m[@]}" --max-tokens 256 >"$tmp/story" 2>"$tmp/err" || fail "greedy run failed: $(cat "$tmp/err")"
cmp -s "$tmp/story" "$models/stories260K.greedy256.txt" || fail "greedy text differs from the fixture"
grep -q "TTFT" "$tmp/err" || fail "no timings on stderr"

# Same seed, same text; the dash and underscore spellings are one flag.
"$bin" "${m[@]}" --max-tokens 40 --temperature 0.9 --top-p 0.9 --seed 7 >"$tmp/a" 2>/dev/null
"$bin" "${m[@]}" --max_tokens 40 --temperature 0.9 --top_p 0.9 --seed 7 >"$tmp/b" 2>/dev/null
cmp -s "$tmp/a" "$tmp/b" || fail "same seed gave different text"
[ -s "$tmp/a" ] || fail "sampled run printed nothing"
# min_p 1 keeps only the most likely token: sampling gives the greedy text.
"$bin" "${m[@]}" --max-tokens 256 --temperature 0.9 --min-p 1 --seed 7 >"$tmp/min_p" 2>/dev/null
cmp -s "$tmp/min_p" "$models/stories260K.greedy256.txt" || fail "min_p 1 did not give the greedy text"
"$bin" "${m[@]}" --max-tokens 256 --temperature 0.9 --seed 7 >"$tmp/sampled" 2>/dev/null
cmp -s "$tmp/sampled" "$models/stories260K.greedy256.txt" && fail "sampling at 0.9 gave the greedy text"

# The same model as a Hugging Face folder written by tandem-convert: the
# folder alone (its tokenizer.json) gives the reference text in f32.
"$convert" --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" --dtype f32 \
  --output "$tmp/hub" >/dev/null || fail "tandem-convert failed"
"$bin" --model "$tmp/hub" --max-tokens 256 >"$tmp/hub_story" 2>"$tmp/err" ||
  fail "hub folder run failed: $(cat "$tmp/err")"
cmp -s "$tmp/hub_story" "$models/stories260K.greedy256.txt" || fail "hub folder text differs"
expect_error "kv_dtype" --model "$tmp/hub" --kv_dtype f8
# --chat renders the folder's chat template: the prompt grows by its markup.
"$bin" --model "$tmp/hub" --chat --prompt "Tell me a story" --max-tokens 8 >/dev/null 2>"$tmp/err" ||
  fail "--chat failed: $(cat "$tmp/err")"
grep -q "prompt 1[0-9] tokens\|prompt [2-9][0-9] tokens" "$tmp/err" ||
  fail "--chat prompt has no template markup: $(cat "$tmp/err")"
rm "$tmp/hub/config.json"
expect_error "config.json" --model "$tmp/hub"
echo "PASS"
