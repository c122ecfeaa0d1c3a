#!/usr/bin/env bash
# Prefill 512, decode batch 1 and decode batch 16 on GGUF files, tandem
# beside llama.cpp in interleaved rounds (tandem, llama.cpp, tandem, ...),
# each on the same file and the same threads. llama.cpp is built outside
# this tree; give its bin folder. Prints one table row per file, round and
# measurement, with the read limit of a decode step (the bytes it reads:
# attention, the dense FFN or the experts the batch touches, the classifier,
# the KV cache; at the read bandwidth tandem-engine-bench measures in the
# same run) and the share of it each side reaches.
#
#   scripts/bench-gguf.sh LLAMA_CPP_BIN ROUNDS FILE...
#
# Decode batch 1 is llama-bench's tg32 (from an empty context) against
# tandem's 32 steps after a 128-token prompt; batch 16 is
# llama-batched-bench's S_TG (16 sequences of 128 prompt tokens, 16 steps)
# against tandem's 16 steps of 16 sequences after 128-token prompts.
# To make the files: tandem-synth --format gguf --gguf_type bf16 (the shape
# flags as in docs/benchmarks/engine-cpu.md), then llama.cpp's llama-quantize FILE OUT Q4_K_M.
set -euo pipefail
llama_bin="$1"
rounds="$2"
shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
bench="${TANDEM_BUILD:-$root/build}/bin/tandem-engine-bench"
for tool in "$bench" "$llama_bin/llama-bench" "$llama_bin/llama-batched-bench"; do
  if [ ! -x "$tool" ]; then
    echo "no $tool: build it first" >&2
    exit 1
  fi
done
threads="${THREADS:-$(nproc)}"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }'; }
share() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.0f%%", 100 * a / b; else print "-" }'; }
echo "| file | round | measurement | tandem tok/s | llama.cpp tok/s | ratio | read limit tok/s | tandem of it | llama.cpp of it |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$rounds"); do
  for file in "$@"; do
    name="$(basename "$file")"
    out="$("$bench" --model "$file" --prompts 512 --batches 1,16 --decode_prompt 128 \
      --decode_steps 16 --repeats 2 --threads "$threads" 2>/dev/null)"
    t_pre="$(sed -n 's/.*prefill 512 *\([0-9.]*\) .*/\1/p' <<<"$out" | head -1)"
    ll="$("$llama_bin/llama-bench" -m "$file" -p 512 -n 32 -t "$threads" -r 2 -o csv 2>/dev/null)"
    l_pre="$(awk -F, '/"512","0"/ {gsub(/"/, "", $0); print $(NF-1)}' <<<"$ll" | head -1)"
    l_dec1="$(awk -F, '/"0","32"/ {gsub(/"/, "", $0); print $(NF-1)}' <<<"$ll" | head -1)"
    lb="$("$llama_bin/llama-batched-bench" -m "$file" -c 2560 -b 2048 -ub 512 -npp 128 -ntg 16 \
      -npl 16 -t "$threads" 2>/dev/null)"
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    l_dec16="$(awk -F'|' '$4 + 0 == 16 {gsub(/ /, "", $9); print $9}' <<<"$lb" | head -1)"
    echo "| $name | $round | prefill 512 | $t_pre | $l_pre | $(ratio "$t_pre" "$l_pre") | | | |"
    for b in 1 16; do
      t_dec="$(sed -n "s/.*decode batch $b  *\([0-9.]*\) .*/\1/p" <<<"$out" | head -1)"
      limit="$(sed -n "s/.*decode batch $b: bandwidth limit \([0-9.]*\) tok\/s.*/\1/p" <<<"$out")"
      l_dec="$l_dec1"
      [ "$b" = 1 ] || l_dec="$l_dec16"
      echo "| $name | $round | decode batch $b | $t_dec | $l_dec | $(ratio "$t_dec" "$l_dec") |" \
        "$limit | $(share "$t_dec" "$limit") | $(share "$l_dec" "$limit") |"
    done
  done
done
