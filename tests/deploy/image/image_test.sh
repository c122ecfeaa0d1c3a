#!/usr/bin/env bash
# The container image as a user runs it, built and run with podman where
# containers can run (as root, with runc). Nothing is pulled from a registry:
# the base is Debian 12 minbase from debootstrap (cached as a tarball under
# CACHE_DIR for a week), imported as a local image; the runtime image is
# deploy/docker/Dockerfile.prebuilt over this build tree's binaries, its
# runtime packages apt-installed from the Debian mirror. A router, a prefill
# and a decode container (host network, loopback only, the fixtures mounted
# read-only) serve a completion that tandem-cli streams from a fourth
# container over gRPC and curl over the OpenAI API; the containers stop
# cleanly on SIGTERM. The image runs as a non-root user and holds no compiler
# and no -dev package. Everything it made is removed at the end.
#
# Usage: image_test.sh SOURCE_DIR BIN_DIR MODELS_DIR CACHE_DIR
# Exit 77 (skip) when not root, when the Debian mirror cannot be reached, or
# when podman cannot run a container here. TANDEM_DEBIAN_MIRROR overrides the
# mirror (default http://deb.debian.org/debian).
set -uo pipefail
[ $# -eq 4 ] || { echo "usage: $0 SOURCE_DIR BIN_DIR MODELS_DIR CACHE_DIR" >&2; exit 2; }
src=$1 bin=$2 models="${TANDEM_MODELS:-$3}" cache=$4
mirror="${TANDEM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security_mirror="${TANDEM_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
suite=bookworm
run_id="$$"
prefix="tandem-imgtest"
base_image="localhost/$prefix-base:$suite-$run_id"
image="localhost/$prefix:$run_id"
containers=("$prefix-$run_id-router" "$prefix-$run_id-prefill" "$prefix-$run_id-decode")
tmp=$(mktemp -d /var/tmp/tandem-image-test.XXXXXX)

skip() { echo "SKIP: $*"; exit 77; }
fail() {
  echo "FAIL: $*"
  for c in "${containers[@]}"; do
    podman container exists "$c" 2>/dev/null || continue
    echo "---- $c"
    podman logs --tail 20 "$c" 2>&1
  done
  exit 1
}
cleanup() {
  podman rm -f -t 0 "${containers[@]}" >/dev/null 2>&1
  podman rmi -f "$image" "$base_image" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
phase_start=$SECONDS
phase() {  # phase NAME: reports how long the phase before it took
  echo "image_test: $1 ($((SECONDS - phase_start)) s so far)"
}

# Machine prerequisites: a missing install step fails, an environment that
# cannot run containers skips.
[ "$(id -u)" -eq 0 ] || skip "needs root (Debian's podman runs these containers as root)"
for tool in podman runc debootstrap curl python3; do
  command -v "$tool" >/dev/null || fail "$tool is missing: run scripts/install-deps.sh"
done
if [ ! -f "$models/stories260K.bin" ] || [ ! -f "$models/tok512.bin" ]; then
  [ "${TANDEM_REQUIRE_MODELS:-}" = 1 ] && fail "fixtures missing from $models"
  skip "fixtures not found in $models"
fi
models=$(cd "$models" && pwd)

# The builder's package list stays a part of what install-deps.sh installs.
deps_packages=$(sed -n '/^packages=(/,/^)/p' "$src/scripts/install-deps.sh" | sed 's/#.*//' |
  tr ' ()' '\n' | sort -u)
for p in $(sed 's/#.*//' "$src/deploy/docker/build-packages.txt"); do
  grep -qxF "$p" <<<"$deps_packages" ||
    fail "deploy/docker/build-packages.txt names $p, which scripts/install-deps.sh does not install"
done

# Debian's podman runs containers here with runc and cgroupfs (crun fails on
# these hosts) and without the default ulimits; /etc stays as it is.
cat >"$tmp/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_CONF="$tmp/containers.conf"

# Containers and images of earlier runs that were killed before cleaning up.
for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null | grep "^$prefix-"); do
  pid=$(cut -d- -f3 <<<"$c")
  kill -0 "$pid" 2>/dev/null || podman rm -f -t 0 "$c" >/dev/null 2>&1
done
for i in $(podman images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | grep "^localhost/$prefix"); do
  pid=${i##*[-:]}
  kill -0 "$pid" 2>/dev/null || podman rmi -f "$i" >/dev/null 2>&1
done

curl -fsS --max-time 30 -o /dev/null "$mirror/dists/$suite/InRelease" ||
  skip "cannot reach the Debian mirror $mirror (set TANDEM_DEBIAN_MIRROR)"

# The base: Debian minbase trimmed like the official -slim images, cached per
# ISO week so that security updates arrive within a week.
mkdir -p "$cache"
tarball="$cache/debian-$suite-minbase-$(date -u +%G-W%V).tar"
exec 9>"$cache/.debootstrap.lock"
flock 9
if [ ! -f "$tarball" ]; then
  rootfs="$tmp/rootfs"
  echo "image_test: debootstrap --variant=minbase $suite from $mirror"
  debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
    fail "debootstrap failed: $(tail -n 20 "$tmp/debootstrap.log")"
  cat >"$rootfs/etc/apt/sources.list" <<LIST
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security_mirror $suite-security main
LIST
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
SLIM
  find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
  rm -rf "$rootfs"/usr/share/{man,info,locale,lintian}/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  tar --numeric-owner -C "$rootfs" -cf "$tarball.partial" . || fail "cannot write $tarball"
  rm -rf "$rootfs"
  rm -f "$cache"/debian-"$suite"-minbase-*.tar
  mv "$tarball.partial" "$tarball"
  phase "debootstrapped $(du -h "$tarball" | cut -f1) into $tarball"
fi
flock -u 9
podman import --change 'CMD ["/bin/bash"]' "$tarball" "$base_image" >/dev/null 2>&1 ||
  fail "podman import of $tarball failed"
probe=$(podman run --rm "$base_image" cat /etc/debian_version 2>&1) ||
  skip "podman cannot run a container here: $probe"
phase "base image $base_image (Debian $probe)"

# The runtime image from this build tree's binaries.
ctx="$tmp/context"
"$src/deploy/docker/prebuilt-context.sh" "$bin" "$ctx" >"$tmp/context.log" 2>&1 ||
  fail "prebuilt-context.sh: $(cat "$tmp/context.log")"
podman build --network host --layers=false --build-arg "BASE=$base_image" \
  -f "$src/deploy/docker/Dockerfile.prebuilt" -t "$image" "$ctx" >"$tmp/build.log" 2>&1 ||
  fail "podman build failed: $(tail -n 30 "$tmp/build.log")"
size=$(podman image inspect --format '{{.Size}}' "$image")
bundled=$(du -sb "$ctx/lib" | cut -f1)
phase "built $image: $((size / 1000000)) MB, of which $((bundled / 1000000)) MB bundled libraries ($(ls "$ctx/lib" | tr '\n' ' '))"

# What the image is: a non-root user, no compiler, no -dev package, the
# libraries of every binary and UCX transport module (RDMA included) there.
user=$(podman image inspect --format '{{.Config.User}}' "$image")
[ "$user" = "10001:10001" ] || fail "image user is '$user', not 10001:10001"
uid=$(podman run --rm "$image" id -u) || fail "cannot run id in the image"
[ "$uid" != 0 ] || fail "the image runs as root"
compilers=$(podman run --rm "$image" sh -c \
  'for c in gcc cc c++ g++ clang clang++ nvcc as ld; do command -v "$c"; done; true')
[ -z "$compilers" ] || fail "the image holds build tools: $compilers"
dev=$(podman run --rm "$image" sh -c "dpkg-query -W -f '\${Package}\n' | grep -- '-dev\$'; true")
[ -z "$dev" ] || fail "the image holds -dev packages: $dev"
missing=$(podman run --rm "$image" sh -c \
  'for f in /usr/local/bin/tandem-* /usr/lib/x86_64-linux-gnu/ucx/libuct_*.so.0; do
     [ -e "$f" ] || echo "$f: no such file"; ldd "$f" | grep "not found" | sed "s|^|$f: |"; done')
[ -z "$missing" ] || fail "libraries missing in the image: $missing"

# A router, a prefill and a decode worker, each in its own container, on
# loopback ports they pick (port 0) and write to a shared folder.
run="$tmp/run"
mkdir -p "$run"
chmod 0777 "$run"
common=(-d --network host -v "$models:/models:ro" -v "$run:/run/tandem")
model=(--model /models/stories260K.bin)
podman run "${common[@]}" --name "${containers[1]}" "$image" tandem-prefill "${model[@]}" \
  --listen 127.0.0.1:0 --port_file /run/tandem/prefill.port >/dev/null ||
  fail "cannot start the prefill container"
podman run "${common[@]}" --name "${containers[2]}" "$image" tandem-decode "${model[@]}" \
  --listen 127.0.0.1:0 --port_file /run/tandem/decode.port >/dev/null ||
  fail "cannot start the decode container"

wait_for_file() {  # wait_for_file FILE CONTAINER: until FILE is written, up to 60 s
  local deadline=$((SECONDS + 60))
  until [ -s "$1" ]; do
    [ "$(podman inspect --format '{{.State.Running}}' "$2" 2>/dev/null)" = true ] ||
      fail "$2 exited during start-up"
    [ $SECONDS -lt $deadline ] || fail "$2 wrote no $(basename "$1") within 60 s"
    sleep 0.2
  done
}
wait_for_file "$run/prefill.port" "${containers[1]}"
wait_for_file "$run/decode.port" "${containers[2]}"
podman run "${common[@]}" --name "${containers[0]}" "$image" tandem-router \
  --tokenizer /models/tok512.bin --served_model_name stories260K.bin \
  --listen 127.0.0.1:0 --port_file /run/tandem/router.port \
  --http_listen 127.0.0.1:0 --http_port_file /run/tandem/http.port \
  --prefill_workers "127.0.0.1:$(cat "$run/prefill.port")" \
  --decode_workers "127.0.0.1:$(cat "$run/decode.port")" >/dev/null ||
  fail "cannot start the router container"
wait_for_file "$run/router.port" "${containers[0]}"
wait_for_file "$run/http.port" "${containers[0]}"
phase "router, prefill and decode containers up"

# gRPC: tandem-cli streams a story; the prompt is longer than
# --local_prefill_tokens (0), so the KV went from prefill to decode over UCX.
prompt="Once upon a time"
podman run --rm --network host "$image" tandem-cli generate \
  --router "127.0.0.1:$(cat "$run/router.port")" --prompt "$prompt" --max-tokens 64 \
  >"$tmp/cli.txt" 2>"$tmp/cli.err" || fail "tandem-cli failed: $(cat "$tmp/cli.err")"
[ -s "$tmp/cli.txt" ] || fail "tandem-cli streamed no text: $(cat "$tmp/cli.err")"
grep -q "(disaggregated)" "$tmp/cli.err" ||
  fail "the request was not disaggregated: $(cat "$tmp/cli.err")"
# The same greedy text as the image's tandem-generate computes in one process.
podman run --rm -v "$models:/models:ro" "$image" tandem-generate "${model[@]}" \
  --tokenizer /models/tok512.bin --prompt "$prompt" --max-tokens 64 >"$tmp/local.txt" 2>/dev/null ||
  fail "tandem-generate failed in the image"
cmp -s "$tmp/cli.txt" "$tmp/local.txt" || fail "cluster text differs from tandem-generate's:
cluster: $(cat "$tmp/cli.txt")
local:   $(cat "$tmp/local.txt")"

# HTTP: the OpenAI API streams the same text as server-sent events.
curl -sSN --max-time 60 "http://127.0.0.1:$(cat "$run/http.port")/v1/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"prompt\": \"$prompt\", \"max_tokens\": 64, \"temperature\": 0, \"stream\": true}" \
  >"$tmp/sse.txt" || fail "HTTP streaming request failed: $(cat "$tmp/sse.txt")"
python3 - "$tmp/sse.txt" "$tmp/cli.txt" <<'PY' || fail "HTTP stream: $(head -c 2000 "$tmp/sse.txt")"
import json, sys
events = [l[len("data: "):] for l in open(sys.argv[1]).read().splitlines() if l.startswith("data: ")]
assert events and events[-1] == "[DONE]", "no [DONE] at the end"
text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if json.loads(e)["choices"])
assert text, "no text streamed"
assert text == open(sys.argv[2]).read(), "streamed %r" % text
PY
phase "streamed $(wc -c <"$tmp/cli.txt") bytes over gRPC and HTTP"

# SIGTERM (podman stop) drains and exits 0: the servers handle it as PID 1.
for c in "${containers[@]}"; do
  podman stop -t 40 "$c" >/dev/null || fail "podman stop $c failed"
  code=$(podman inspect --format '{{.State.ExitCode}}' "$c")
  [ "$code" = 0 ] || fail "$c exited with $code after SIGTERM"
done
phase "containers stopped cleanly"
echo "PASS"
