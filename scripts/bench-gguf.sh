#!/usr/bin/env bash
# Batch-1 decode and prefill on GGUF files, tandem beside llama.cpp in
# interleaved rounds (tandem, llama.cpp, tandem, ...), each on the same
# file and the same threads. llama.cpp is built outside this tree; give its
# bin folder. Prints one table row per file and round.
#
#   scripts/bench-gguf.sh LLAMA_CPP_BIN ROUNDS FILE...
#
# To make the files: tandem-synth --format gguf --gguf_type bf16 (the shape
# flags as in the README), then llama.cpp's llama-quantize FILE OUT Q4_K_M.
set -euo pipefail
llama_bin="$1"
rounds="$2"
shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
bench="${TANDEM_BUILD:-$root/build}/bin/tandem-engine-bench"
for tool in "$bench" "$llama_bin/llama-bench"; do
  if [ ! -x "$tool" ]; then
    echo "no $tool: build it first" >&2
    exit 1
  fi
done
threads="${THREADS:-$(nproc)}"
echo "| file | round | measurement | tandem tok/s | llama.cpp tok/s | ratio | tandem of the read limit |"
echo "|---|---:|---|---:|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for file in "$@"; do
    name="$(basename "$file")"
    out="$("$bench" --model "$file" --prompts 512 --batches 1 --decode_steps 32 --repeats 2 \
      --threads "$threads" 2>/dev/null)"
    t_dec="$(sed -n 's/.*decode batch 1 *\([0-9.]*\) .*/\1/p' <<<"$out" | head -1)"
    t_pre="$(sed -n 's/.*prefill 512 *\([0-9.]*\) .*/\1/p' <<<"$out" | head -1)"
    share="$(sed -n 's/.*decode batch 1: bandwidth limit.* at \([0-9]*%\).*/\1/p' <<<"$out")"
    ll="$("$llama_bin/llama-bench" -m "$file" -p 512 -n 32 -t "$threads" -r 2 -o csv 2>/dev/null)"
    l_pre="$(awk -F, '/"512","0"/ {gsub(/"/, "", $0); print $(NF-1)}' <<<"$ll" | head -1)"
    l_dec="$(awk -F, '/"0","32"/ {gsub(/"/, "", $0); print $(NF-1)}' <<<"$ll" | head -1)"
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
    echo "| $name | $round | decode batch 1 | $t_dec | $l_dec | $(ratio "$t_dec" "$l_dec") | $share |"
    echo "| $name | $round | prefill 512 | $t_pre | $l_pre | $(ratio "$t_pre" "$l_pre") | |"
  done
done
