#!/usr/bin/env bash
# tandem-perplexity beside llama.cpp's llama-perplexity on the same GGUF
# files and text: both score the second half of each chunk of CTX tokens
# (llama-perplexity's default procedure), with the same KV cache type and
# THREADS threads each. Prints each file's two figures, their relative
# difference and the two tokenizers' token counts for the text (they must
# agree, or the chunks hold different tokens). Not a test. The files need a
# vocabulary llama.cpp reads (tandem-convert --format gguf --tokenizer FILE
# writes one) and TOKENIZER is that vocabulary's file for tandem.
#   scripts/perplexity-vs-llama.sh LLAMA_BIN TEXT TOKENIZER CTX CHUNKS FILE.gguf...
# CHUNKS 0 = every whole chunk. Environment: THREADS (2), KV (f16, llama.cpp's
# default; or f32, bf16), TANDEM_BIN (build/bin).
# e.g. scripts/perplexity-vs-llama.sh ~/llama.cpp/build/bin /usr/share/common-licenses/GPL-3 \
#        ../shared/models/tokenizer.model 512 2 model-f32.gguf model-Q4_K_M.gguf
set -euo pipefail
[ $# -ge 6 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
root="$(cd "$(dirname "$0")/.." && pwd)"
llama="$1" text="$2" tokenizer="$3" ctx="$4" chunks="$5"
shift 5
threads="${THREADS:-2}" kv="${KV:-f16}"
tandem="${TANDEM_BIN:-$root/build/bin}/tandem-perplexity"
case "$kv" in f32 | f16 | bf16) ;; *) echo "KV=$kv: give f32, f16 or bf16" >&2; exit 2 ;; esac
# llama-perplexity takes --chunks 0 as no chunk at all; -1 is every chunk.
llama_chunks="$chunks"
[ "$chunks" != 0 ] || llama_chunks=-1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "text $text, chunks of $ctx, chunks ${chunks/#0/all}, KV $kv, $threads threads"
printf '%-24s %8s %8s %14s %14s %10s\n' "file" "tokens" "(llama)" "tandem" "llama.cpp" "diff"
for file in "$@"; do
  "$tandem" --model "$file" --tokenizer "$tokenizer" --file "$text" --ctx "$ctx" \
    --chunks "$chunks" --threads "$threads" --kv_dtype "$kv" >"$tmp/ours" 2>"$tmp/ours.err" || true
  ours=$(awk '/^perplexity/ {print $2}' "$tmp/ours")
  count=$(sed -n 's/.*(.* chunks of [0-9]*; \([0-9]*\) tokens in the text).*/\1/p' "$tmp/ours")
  "$llama/llama-perplexity" -m "$file" -f "$text" -c "$ctx" --chunks "$llama_chunks" \
    -t "$threads" -ctk "$kv" -ctv "$kv" >"$tmp/theirs" 2>&1 || true
  theirs=$(awk '/Final estimate/ {print $5}' "$tmp/theirs")
  # llama-perplexity prints its token count only when the text is too short
  # for the context: ask for a context of twice the count tandem found.
  theirs_count=-
  if [ -n "$count" ] && [ "$count" -le 65536 ]; then
    theirs_count=$("$llama/llama-perplexity" -m "$file" -f "$text" -c "$count" -t 1 2>&1 |
      sed -n 's/.*tokenizes to only \([0-9]*\) tokens.*/\1/p')
  fi
  [ -n "$ours" ] || echo "tandem-perplexity failed on $file: $(tail -1 "$tmp/ours.err")" >&2
  [ -n "$theirs" ] || echo "llama-perplexity failed on $file: $(tail -1 "$tmp/theirs")" >&2
  printf '%-24s %8s %8s %14s %14s %10s\n' "$(basename "$file")" "${count:--}" "${theirs_count:--}" \
    "${ours:-failed}" "${theirs:-failed}" \
    "$(awk -v a="${ours:-0}" -v b="${theirs:-0}" \
      'BEGIN {if (a > 0 && b > 0) printf "%+.3f%%", 100 * (a - b) / b; else print "-"}')"
done
