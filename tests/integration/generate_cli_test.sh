#!/usr/bin/env bash
# tandem-generate as a user runs it: stdout carries only the continuation,
# and bad input ends with a message that says what to change.
# Usage: generate_cli_test.sh PATH/TO/tandem-generate MODELS_DIR
set -uo pipefail
bin="$1"
models="${TANDEM_MODELS:-$2}"
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
echo "PASS"
