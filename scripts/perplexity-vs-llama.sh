#!/usr/bin/env bash
# tandem-perplexity beside llama.cpp's llama-perplexity on the same GGUF
# files and text: both score the second half of each chunk of CTX tokens
# (llama-perplexity's default procedure). Prints each file's two figures and
# their relative difference. Not a test. The files need a vocabulary
# llama.cpp reads (tandem-convert --format gguf --tokenizer FILE writes one)
# and TOKENIZER is that vocabulary's file for tandem.
#   scripts/perplexity-vs-llama.sh LLAMA_BIN TEXT TOKENIZER CTX CHUNKS FILE.gguf...
# e.g. scripts/perplexity-vs-llama.sh ~/llama.cpp/build/bin /usr/share/common-licenses/GPL-3 \
#        ../shared/models/tokenizer.model 512 2 model-f32.gguf model-Q4_K_M.gguf
set -euo pipefail
[ $# -ge 6 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
root="$(cd "$(dirname "$0")/.." && pwd)"
llama="$1" text="$2" tokenizer="$3" ctx="$4" chunks="$5"
shift 5
threads="${THREADS:-2}"

printf '%-28s %14s %14s %10s\n' "file" "tandem" "llama.cpp" "diff"
for file in "$@"; do
  ours=$("$root/build/bin/tandem-perplexity" --model "$file" --tokenizer "$tokenizer" \
    --file "$text" --ctx "$ctx" --chunks "$chunks" --threads "$threads" 2>/dev/null |
    awk '/^perplexity/ {print $2}')
  theirs=$("$llama/llama-perplexity" -m "$file" -f "$text" -c "$ctx" --chunks "$chunks" \
    -t "$threads" 2>&1 | awk '/Final estimate/ {print $5}')
  printf '%-28s %14s %14s %10s\n' "$(basename "$file")" "${ours:-failed}" "${theirs:-failed}" \
    "$(awk -v a="${ours:-0}" -v b="${theirs:-0}" \
      'BEGIN {if (b > 0) printf "%+.3f%%", 100 * (a - b) / b; else print "-"}')"
done
