#!/usr/bin/env bash
# The Python client (clients/python) as a user installs it: a venv made with
# --system-site-packages (Debian's grpcio and protobuf), `pip install
# --no-build-isolation --no-index` of a copy of clients/python beside the
# protos (offline; the stubs are generated at build time), then
# python_client_test.py and examples/stream.py against a local cluster:
# deploy/local/cluster.sh starts a router with an API key, one prefill and
# one decode worker, and a second router over the same workers serves TLS
# with a self-signed certificate.
# Usage: python_client_test.sh BIN_DIR MODELS_DIR
set -uo pipefail
bin="$1"
models="${TANDEM_MODELS:-$2}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp=$(mktemp -d)
export TANDEM_BIN="$bin" TANDEM_CLUSTER_DIR="$tmp/cluster" TANDEM_MODELS="$models"
# Below the ephemeral range (32768+), in a band of its own beside the other
# cluster scripts' (metrics use port+1000..port+1220).
port=$((12000 + ($$ % 50) * 20))
tls_pid=""
cleanup() {
  [ -n "$tls_pid" ] && kill -TERM "$tls_pid" 2>/dev/null && wait "$tls_pid" 2>/dev/null
  "$root/deploy/local/cluster.sh" down >/dev/null 2>&1
  if [ "${TANDEM_KEEP_TEST_DIRS:-}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/cluster/*.log "$tmp"/tls-router.log; do
    [ -f "$f" ] && { echo "---- $f"; tail -n 20 "$f"; }
  done
  exit 1
}

if [ ! -f "$models/stories260K.bin" ] || [ ! -f "$models/stories260K.greedy256.txt" ]; then
  if [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ]; then fail "fixtures missing from $models"; fi
  echo "SKIP: fixtures not found in $models"; exit 0
fi
models=$(cd "$models" && pwd)  # the tests run in $tmp
# Debian's interpreter, whose dist-packages hold python3-grpcio and
# python3-protobuf (another python3 may come first in PATH).
python="${TANDEM_PYTHON:-}"
if [ -z "$python" ]; then
  python=python3
  [ -x /usr/bin/python3 ] && python=/usr/bin/python3
fi
"$python" -c 'import grpc, google.protobuf, venv' 2>"$tmp/import.err" ||
  fail "$python lacks grpcio, protobuf or venv (scripts/install-deps.sh installs python3-grpcio,
python3-protobuf and python3-venv): $(cat "$tmp/import.err")"

# The client's folder and the protos, laid out as in the repository, so that
# the build writes into the copy, never into the sources.
mkdir -p "$tmp/src"
tar -C "$root" --exclude=build --exclude='*.egg-info' --exclude=__pycache__ -cf - \
  clients/python proto | tar -C "$tmp/src" -xf - || fail "cannot copy clients/python"
"$python" -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1 ||
  fail "python3 -m venv failed: $(tail -n 5 "$tmp/venv.log")"
"$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index --no-cache-dir \
  --disable-pip-version-check "$tmp/src/clients/python" >"$tmp/pip.log" 2>&1 ||
  fail "pip install ./clients/python failed:
$(tail -n 20 "$tmp/pip.log")"

key="tandem-py-test-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
"$root/deploy/local/cluster.sh" up --port "$port" --prefill 1 --decode 1 \
  --router_args "--api_key $key" 2>"$tmp/up.err" || fail "up: $(cat "$tmp/up.err")"

# A router over the same workers serving TLS, with a self-signed certificate
# for 127.0.0.1 as its own CA.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$tmp/key.pem" -out "$tmp/cert.pem" \
  >"$tmp/openssl.log" 2>&1 || fail "openssl: $(cat "$tmp/openssl.log")"
"$bin/tandem-router" --listen "127.0.0.1:$((port + 10))" --port_file "$tmp/tls.port" \
  --tokenizer "$models/tok512.bin" --prefill_workers "127.0.0.1:$((port + 100))" \
  --decode_workers "127.0.0.1:$((port + 200))" --tls_cert "$tmp/cert.pem" \
  --tls_key "$tmp/key.pem" >"$tmp/tls-router.log" 2>&1 &
tls_pid=$!
deadline=$((SECONDS + 60))
until [ -s "$tmp/tls.port" ]; do
  kill -0 "$tls_pid" 2>/dev/null || fail "the TLS router exited"
  [ "$SECONDS" -lt "$deadline" ] || fail "the TLS router did not start within 60 s"
  sleep 0.1
done

start=$SECONDS
(cd "$tmp" && TANDEM_TEST_ROUTER="127.0.0.1:$port" TANDEM_TEST_API_KEY="$key" \
  TANDEM_TEST_TLS_ROUTER="127.0.0.1:$((port + 10))" TANDEM_TEST_TLS_CA="$tmp/cert.pem" \
  TANDEM_TEST_GREEDY_TEXT="$models/stories260K.greedy256.txt" \
  timeout 240 "$tmp/venv/bin/python" "$root/tests/e2e/python_client_test.py" -v) \
  >"$tmp/unittest.out" 2>&1
rc=$?
cat "$tmp/unittest.out"
[ "$rc" -eq 0 ] || fail "python_client_test.py failed (exit $rc)"
echo "python_client_test.py took $((SECONDS - start)) s"

# The README's example, as a user runs it: a greedy completion streamed to
# the end, then one cancelled after two chunks.
example="$tmp/src/clients/python/examples/stream.py"
timeout 60 "$tmp/venv/bin/python" "$example" --router "127.0.0.1:$port" --api-key "$key" \
  --prompt "Once upon a time" --max-tokens 12 >"$tmp/example.out" 2>"$tmp/example.err" ||
  fail "examples/stream.py failed: $(cat "$tmp/example.err")"
[ -s "$tmp/example.out" ] || fail "examples/stream.py printed no text"
grep -Eq '^\[(length|stop): [0-9]+ prompt tokens, [0-9]+ generated; TTFT [0-9.]+ ms; decode worker ' \
  "$tmp/example.err" || fail "examples/stream.py's summary: $(cat "$tmp/example.err")"
timeout 60 "$tmp/venv/bin/python" "$example" --router "127.0.0.1:$port" --api-key "$key" \
  --max-tokens 64 --stop-after 2 >/dev/null 2>"$tmp/example-cancel.err" ||
  fail "examples/stream.py --stop-after failed: $(cat "$tmp/example-cancel.err")"
grep -q '^\[cancelled after [0-9]\+ tokens' "$tmp/example-cancel.err" ||
  fail "examples/stream.py --stop-after 2: $(cat "$tmp/example-cancel.err")"

# Every process survived the cancels, deadlines and refusals.
"$root/deploy/local/cluster.sh" status >"$tmp/status" || fail "status failed"
[ "$(grep -c running "$tmp/status")" -eq 3 ] || fail "status shows $(cat "$tmp/status")"
kill -0 "$tls_pid" 2>/dev/null || fail "the TLS router exited"
"$root/deploy/local/cluster.sh" down 2>"$tmp/down.err" || fail "down failed"
grep -q "did not drain" "$tmp/down.err" && fail "a process had to be killed"
# The router logged the cancels of test_cancel_mid_stream and the example's
# (12; a call past its 1 ms deadline may count too), once it had drained.
cancelled=$(grep -c '"status":"cancelled"' "$tmp/cluster/requests.jsonl")
[ "$cancelled" -ge 12 ] || fail "the router logged $cancelled cancelled requests, not 12 or more"
echo "PASS"
