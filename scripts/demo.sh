#!/usr/bin/env bash
# The main job: builds the binaries it runs, converts the stories260K fixture model
# (../shared/models, or $TANDEM_MODELS) into a Hugging Face folder (bf16
# safetensors, tokenizer.json) as users download them, starts a local
# cluster (a router, two prefill and two decode workers on loopback, bf16 KV
# moving over UCX) serving that folder, streams a story through it with
# tandem-cli, and stops the cluster. Without the fixtures it serves a
# synthetic model (random weights). Extra arguments go to tandem-cli, e.g.
#   ./scripts/demo.sh --prompt "Once upon a time" --max-tokens 200
# TANDEM_KEEP_CLUSTER=1 leaves the cluster running (stop it with
# deploy/local/cluster.sh down).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs (no CUDA backend without a GPU to run it);
# ./scripts/test.sh builds the rest.
TANDEM_CUDA_IF_GPU=1 TANDEM_BUILD_TARGETS="tandem-router tandem-prefill tandem-decode tandem-synth tandem-convert \
tandem-cli" ./scripts/build.sh
port="${TANDEM_PORT:-8100}"
export TANDEM_CLUSTER_DIR="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster}"
deploy/local/cluster.sh down >/dev/null 2>&1 || true
models="${TANDEM_MODELS:-../shared/models}"
model_args=()
if [ -f "$models/stories260K.bin" ] && [ -f "$models/tok512.bin" ]; then
  folder=build/demo-models/stories260K
  ./build/bin/tandem-convert --model "$models/stories260K.bin" --tokenizer "$models/tok512.bin" \
    --dtype bf16 --output "$folder"
  model_args=(--model "$folder")
fi
deploy/local/cluster.sh up --port "$port" "${model_args[@]}"
if [ "${TANDEM_KEEP_CLUSTER:-0}" != 1 ]; then
  trap 'deploy/local/cluster.sh down' EXIT
fi
./build/bin/tandem-cli generate --router "127.0.0.1:$port" --prompt "Once upon a time" \
  --max-tokens 256 "$@"
echo
