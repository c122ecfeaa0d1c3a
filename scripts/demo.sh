#!/usr/bin/env bash
# The main job: builds tandem, starts a local cluster (a router, two prefill
# and two decode workers on loopback, KV moving over UCX) serving the
# stories260K fixture model (../shared/models, or $TANDEM_MODELS; a synthetic
# model when the fixtures are absent), streams a story through it with
# tandem-cli, and stops the cluster. Extra arguments go to tandem-cli, e.g.
#   ./scripts/demo.sh --prompt "Once upon a time" --max-tokens 200
# TANDEM_KEEP_CLUSTER=1 leaves the cluster running (stop it with
# deploy/local/cluster.sh down).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
port="${TANDEM_PORT:-8100}"
export TANDEM_CLUSTER_DIR="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster}"
deploy/local/cluster.sh down >/dev/null 2>&1 || true
deploy/local/cluster.sh up --port "$port"
if [ "${TANDEM_KEEP_CLUSTER:-0}" != 1 ]; then
  trap 'deploy/local/cluster.sh down' EXIT
fi
./build/bin/tandem-cli generate --router "127.0.0.1:$port" --prompt "Once upon a time" \
  --max-tokens 256 "$@"
echo
