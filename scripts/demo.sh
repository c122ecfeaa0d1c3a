#!/usr/bin/env bash
# The main job: builds tandem and streams a story from the stories260K
# fixture model (../shared/models, or $TANDEM_MODELS). Without the fixtures it
# generates a synthetic model and streams token ids from it instead.
# Extra arguments go to tandem-generate, e.g. --prompt "Once upon a time".
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
models="${TANDEM_MODELS:-../shared/models}"
if [ -f "$models/stories260K.bin" ] && [ -f "$models/tok512.bin" ]; then
  exec ./build/bin/tandem-generate --model "$models/stories260K.bin" \
    --tokenizer "$models/tok512.bin" --max-tokens 256 "$@"
fi
echo "demo: no fixtures in $models; using a synthetic model (random weights, token ids)" >&2
synthetic=build/synthetic-stories260K.bin
[ -f "$synthetic" ] || ./build/bin/tandem-synth --output "$synthetic" --shape custom \
  --dim 64 --hidden_dim 172 --n_layers 5 --n_heads 8 --n_kv_heads 4 --vocab_size 512 \
  --seq_len 512 >&2
exec ./build/bin/tandem-generate --model "$synthetic" --max-tokens 64 "$@"
