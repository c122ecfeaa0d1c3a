# Shared set-up of the benchmark scripts (sourced, not run): paths, a
# scratch folder and a local cluster that are cleaned up on exit, and a
# stories15M-shaped model with its context stretched to 2048.
#   source "$(dirname "$0")/bench-common.sh" PORT_BASE
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="${TANDEM_MODELS:-$root/../shared/models}"
bin="$root/build/bin"
port=$(($1 + $$ % 5000))
work="$(mktemp -d)"
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$work/cluster"
trap '"$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

model="$work/stories15M"
"$bin/tandem-convert" --synthetic stories15M --seq_len 2048 --tokenizer "$models/tokenizer.bin" \
  --dtype f32 --output "$model" >/dev/null

# cluster_up ARGS...: deploy/local/cluster.sh up on $port with $model; its
# messages go to $work/cluster.log, shown if it fails.
cluster_up() {
  "$root/deploy/local/cluster.sh" up --port "$port" --model "$model" "$@" \
    >/dev/null 2>>"$work/cluster.log" || { cat "$work/cluster.log" >&2; exit 1; }
}
cluster_down() { "$root/deploy/local/cluster.sh" down >/dev/null 2>&1 || true; }
