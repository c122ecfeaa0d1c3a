#!/usr/bin/env bash
# Installs every Debian 12 package that tandem's build, tests and tools need.
# Idempotent: packages already present are left alone and apt is not asked
# for anything when nothing is missing. Runs as root, or through sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev
  libgtest-dev libgmock-dev googletest
  libopenblas-openmp-dev
  libsentencepiece-dev
  libpcre2-dev
  libxxhash-dev
  librandom123-dev
  libucx-dev ucx-utils iproute2 curl python3 python3-jinja2
  # The numpy reference of tests/unit/engine/hf_reference.py.
  python3-numpy
  # The Python client (clients/python), pip-installed into a venv made with
  # --system-site-packages; its stubs come from protoc and grpc_python_plugin.
  python3-grpcio python3-protobuf python3-venv python3-pip python3-setuptools python3-wheel
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev libcpp-httplib-dev nlohmann-json3-dev
  libboost1.81-dev libssl-dev openssl
  # Deployment checks: the chart rendered with Go's text/template and Sprig,
  # yamllint; the container image built from a debootstrapped base with
  # podman (run as root with runc).
  golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev yamllint
  podman runc debootstrap
  # Fuzzing (scripts/fuzz.sh, the `fuzz` preset): clang and libFuzzer.
  clang-14 libfuzzer-14-dev
  # scripts/check-format.sh: the formatter CI checks the tree with.
  clang-format-14
  # scripts/thread-safety.sh configures with clang-14: its OpenMP runtime.
  libomp-14-dev
)
# The Llama 3 tokenizer tests run a reference encoder with node + npm. A node
# installed from elsewhere (NodeSource's package bundles npm and conflicts with
# Debian's npm) is kept; Debian 12's nodejs 18 + npm 9 run the script too.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
