#!/usr/bin/env bash
# tandem-perplexity as a user runs it, on a GGUF file that tandem-convert
# writes from stories260K with its vocabulary: the figure equals the one on
# the llama2.c checkpoint it came from (the same weights), an int8 cache's
# differs but stays close, and bad input ends with a message that says what
# to change.
# Usage: perplexity_cli_test.sh PATH/TO/tandem-perplexity MODELS_DIR PATH/TO/tandem-convert
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

expect_error "--model and --file are required"
if [ ! -f "$models/stories260K.bin" ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from $models"; fi
  echo "SKIP: fixtures not found in $models"; exit 0
fi
for _ in 1 2 3 4; do cat "$models/stories260K.greedy256.txt"; done >"$tmp/text"
"$convert" --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" --format gguf \
  --dtype f32 --output "$tmp/s.gguf" >/dev/null 2>"$tmp/err" || fail "convert: $(cat "$tmp/err")"
m=(--tokenizer "$models/tok512.bin" --file "$tmp/text" --ctx 128 --threads 1)
expect_error "needs --tokenizer" --model "$tmp/s.gguf" --file "$tmp/text"
expect_error "the model's context, 512" --model "$tmp/s.gguf" "${m[@]}" --ctx 1024
expect_error "at least 1024" --model "$tmp/s.gguf" "${m[@]}" --ctx 512 \
  --file "$models/stories260K.greedy256.txt"
expect_error "int8" --model "$tmp/s.gguf" "${m[@]}" --kv_dtype int4
expect_error "cannot read --file" --model "$tmp/s.gguf" "${m[@]}" --file "$tmp/missing"
ppl() { "$bin" --model "$@" 2>"$tmp/err" | awk '/^perplexity/ {print $2}'; }
gguf=$(ppl "$tmp/s.gguf" "${m[@]}")
bin_ppl=$(ppl "$models/stories260K.bin" "${m[@]}")
int8=$(ppl "$tmp/s.gguf" "${m[@]}" --kv_dtype int8)
[ -n "$gguf" ] || fail "no perplexity printed: $(cat "$tmp/err")"
[ "$gguf" = "$bin_ppl" ] || fail "the GGUF file gives $gguf, its checkpoint $bin_ppl"
awk -v a="$gguf" -v b="$int8" 'BEGIN {exit !(a > 1 && a < 3 && b != a && b / a < 1.02 && a / b < 1.02)}' ||
  fail "perplexity $gguf (f32 KV) and $int8 (int8 KV) are not as expected"
echo "PASS: perplexity $gguf (f32 KV), $int8 (int8 KV)"
