#!/usr/bin/env bash
# What KV checksums cost end to end: the time to first token of one long
# prompt (about 2,048 tokens) through a local cluster (1 router, 1 prefill,
# 1 decode worker; KV over UCX's shared memory) with the decode worker's
# --kv_checksums (the default) and with --nokv_checksums, the two clusters
# taking turns round by round so that both see the same machine load.
# Prefix caching is off in both pools, so that every run computes and ships
# the whole prompt.
# Prints each round's TTFTs, the medians and their ratio. Not a test.
#   scripts/bench-checksums.sh [ROUNDS] [RUNS_PER_ROUND]
# The model is synthetic (tandem-synth, the stories15M shape with a 4,096
# token context, f32 weights and KV: 13.8 KB of KV a token). Run after
# scripts/build.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-5}"
runs="${2:-4}"
bin="$root/build/bin"
work=$(mktemp -d)
port=$((23000 + $$ % 10000))
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$work/cluster"
trap '"$root/deploy/local/cluster.sh" down >/dev/null 2>&1; rm -rf "$work"' EXIT

"$bin/tandem-synth" --shape stories15M --seq_len 4096 --output "$work/model.bin" \
  --tokenizer_output "$work/tok.bin" >/dev/null
# About 2,048 tokens of the synthetic vocabulary: the words of the
# tokenizer's own pieces, repeated.
prompt=$(python3 - "$work/tok.bin" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
(max_len,) = struct.unpack_from("<i", data, 0)
pos, pieces = 4, []
while pos < len(data):
    _score, n = struct.unpack_from("<fi", data, pos)
    pos += 8
    piece = data[pos:pos + n].decode("utf-8", "replace")
    pos += n
    if piece.isalpha():
        pieces.append(piece)
words = (pieces[100:400] * 20)[:2040]
print(" ".join(words))
EOF
)

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

: >"$work/on" ; : >"$work/off"
for round in $(seq "$rounds"); do
  for mode in on off; do
    flag=--kv_checksums
    [[ $mode == off ]] && flag=--nokv_checksums
    "$root/deploy/local/cluster.sh" up --port "$port" --prefill 1 --decode 1 \
      --model "$work/model.bin" --tokenizer "$work/tok.bin" --prefill_args "--noprefix_cache" \
      --decode_args "--noprefix_cache $flag" >/dev/null 2>&1
    line=""
    for _ in $(seq "$runs"); do
      out=$("$bin/tandem-cli" generate --router "127.0.0.1:$port" --prompt "$prompt" \
        --max-tokens 1 2>&1 >/dev/null)
      ttft=$(grep -o 'TTFT [0-9.]*' <<<"$out" | awk '{print $2}')
      tokens=$(grep -o 'prompt [0-9]* tokens' <<<"$out" | awk '{print $2}')
      [[ -n $ttft ]] || { echo "bench-checksums: no TTFT in: $out" >&2; exit 1; }
      echo "$ttft" >>"$work/$mode"
      line+=" $ttft"
    done
    "$root/deploy/local/cluster.sh" down >/dev/null 2>&1
    echo "round $round, checksums $mode, prompt of $tokens tokens: TTFT ms$line"
  done
done
on=$(median <"$work/on")
off=$(median <"$work/off")
echo "median TTFT: checksums on $on ms, off $off ms, ratio $(awk -v a="$on" -v b="$off" \
  'BEGIN {printf "%.3f", a / b}')"
