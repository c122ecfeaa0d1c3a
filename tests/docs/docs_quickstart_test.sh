#!/usr/bin/env bash
# docs/quickstart.md as a reader runs it: every command block the page does
# not mark as not run (scripts/check-docs.py --runnable), in order, from the
# repository root, against the cluster the page starts on ports 8100/8101.
# Each block must succeed, and the output must hold what the page promises:
# a streamed story, OpenAI responses, a plan. Then the cluster is gone.
# Usage: docs_quickstart_test.sh BIN_DIR
set -uo pipefail
bin="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
tmp=$(mktemp -d)
export TANDEM_CLUSTER_DIR="$tmp/cluster"
cleanup() { deploy/local/cluster.sh down >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  tail -n 40 "$tmp/out" 2>/dev/null
  for f in "$tmp"/cluster/*.log; do [ -f "$f" ] && { echo "---- $f"; tail -n 20 "$f"; }; done
  exit 1
}

# The page's commands name ../shared/models and build/bin.
if [ ! -f ../shared/models/stories260K.bin ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from ../shared/models"; fi
  echo "SKIP: fixtures not found in ../shared/models"; exit 0
fi
[ "$(cd "$bin" && pwd)" = "$root/build/bin" ] || {
  echo "SKIP: the quickstart runs build/bin; this tree builds into $bin"; exit 0; }

python3 scripts/check-docs.py --runnable docs/quickstart.md >"$tmp/quickstart.sh" ||
  fail "cannot extract the quickstart's commands"
# A page that marked its main steps as not run would pass with nothing run.
for must in "cluster.sh up" "tandem-cli generate" "/v1/completions" "/v1/chat/completions" \
  "tandem_client" "tandem-plan" "cluster.sh down"; do
  grep -q -- "$must" "$tmp/quickstart.sh" || fail "the quickstart no longer runs '$must'"
done
bash -euxo pipefail "$tmp/quickstart.sh" >"$tmp/out" 2>&1 || fail "a quickstart command failed"

grep -q '"object":"text_completion"\|"object": "text_completion"' "$tmp/out" ||
  fail "no completion from /v1/completions"
grep -q 'chat.completion.chunk' "$tmp/out" || fail "no streamed chat chunks"
grep -q 'data: \[DONE\]' "$tmp/out" || fail "the chat stream did not end with [DONE]"
grep -q 'tandem-cli\] finish' "$tmp/out" || fail "tandem-cli printed no summary"
[ -s /tmp/tandem-values.yaml ] && grep -q 'replicas' /tmp/tandem-values.yaml ||
  fail "tandem-plan wrote no Helm values"
[ ! -e "$TANDEM_CLUSTER_DIR/router.pid" ] || ! kill -0 "$(cat "$TANDEM_CLUSTER_DIR/router.pid")" 2>/dev/null ||
  fail "the cluster still runs after the page's last step"
echo "PASS: $(grep -c '^+ ' "$tmp/out") commands of docs/quickstart.md ran"
