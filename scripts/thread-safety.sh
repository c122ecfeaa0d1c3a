#!/usr/bin/env bash
# Clang's thread-safety analysis over every non-test source: configures the
# clang-tsa preset (clang++-14, build-clang-tsa/, tests and CUDA off, with
# -Wthread-safety -Werror=thread-safety), generates the protobuf headers, and
# runs each compile command of compile_commands.json with -fsyntax-only, two
# at a time. A member marked ABSL_GUARDED_BY touched without its lock, or a
# function called without the locks it ABSL_EXCLUSIVE_LOCKS_REQUIRED, fails
# the run. The preset builds without the unity build, so that each source
# is a compile command of its own. The analysis is a front-end pass, so
# nothing is code-generated or linked. THREAD_SAFETY_JOBS overrides the two
# parallel compiles.
#
# TANDEM_TSA_REUSE_FUZZ=1 (CI, after scripts/fuzz.sh) leaves out the sources
# that the fuzz build compiles: the `fuzz` preset is clang 14 with the same
# -Wthread-safety -Werror=thread-safety, so they were analysed there. The
# fuzz build is brought up to date first (a no-op right after fuzz.sh), so a
# source changed since cannot slip through.
#
# A source is analysed only when it, or a project header it includes (the
# quoted #includes, followed), names a mutex, a lock or a capability
# annotation: the analysis reports only on those, so the others have
# nothing it could find.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v clang++-14 >/dev/null || {
  echo "thread-safety.sh: clang++-14 missing (scripts/install-deps.sh installs it)" >&2
  exit 1
}

build=build-clang-tsa
werror=OFF
if [[ ${TANDEM_WERROR:-0} == 1 ]]; then werror=ON; fi
cmake --preset clang-tsa -DTANDEM_WERROR="$werror" >/dev/null
# Every source includes the generated gRPC/protobuf headers somewhere; only
# the headers are needed, not the compiled library.
mapfile -t proto_headers < <(ninja -C "$build" -t targets all |
  sed -n 's/^\(proto\/[^:]*\.pb\.h\):.*/\1/p')
ninja -C "$build" "${proto_headers[@]}" >/dev/null

# One NUL-terminated shell command per source (generated sources excluded),
# each compiled only as far as the analysis goes. Clang 14 accepts the CPU
# kernels' _Float16 only for targets with AVX512-FP16; since nothing is
# code-generated, -mavx512fp16 costs nothing (no source has ISA #ifdefs).
# GCC-only warning names in pragmas are not worth a warning here.
: >"$build/tsa-covered"
if [[ ${TANDEM_TSA_REUSE_FUZZ:-0} == 1 ]]; then
  lock=${TANDEM_BUILD_LOCK:-/tmp/tandem-build.lock}
  mapfile -t fuzz_targets < <(./scripts/fuzz.sh list | sed 's/^/fuzz_/')
  flock "$lock" ninja -C build-fuzz -j2 "${fuzz_targets[@]}" >/dev/null
  # Every source a fuzz target's compile commands name, where the command
  # carries the analysis.
  ninja -C build-fuzz -t commands "${fuzz_targets[@]}" |
    grep -e '-Werror=thread-safety' | grep -o ' -c [^ ]*' | sed 's/^ -c //' |
    sort -u >"$build/tsa-covered"
fi
python3 - "$build/compile_commands.json" "$build/tsa-covered" "$PWD" >"$build/tsa-commands" <<'EOF'
import json, os, re, shlex, sys

covered = set()
for line in open(sys.argv[2]):
    path = os.path.realpath(line.strip()) if line.strip() else None
    if not path:
        continue
    covered.add(path)
    # A unit of the unity build stands for the sources it includes.
    if re.search(r"/Unity/unity_[0-9]+_cxx\.cxx$", path):
        for included in re.findall(r'^#include "([^"]+)"', open(path).read(), re.M):
            covered.add(os.path.realpath(included))
root = sys.argv[3]

# A source can break the analysis only through a capability: a mutex, a
# scoped lock, or a member or function annotated with one. One whose own
# text and whose project headers, followed through every quoted #include,
# name none of them has nothing to analyse, and is left out.
LOCKISH = re.compile(r"\bMutex\b|MutexLock|CondVar|"
                     r"ABSL_[A-Z_]*(GUARDED|LOCK|CAPABILITY|ACQUIRE|RELEASE|ASSERT|THREAD_SAFETY)")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
memo = {}


def touches_locks(path):
    if path in memo:
        return memo[path]
    memo[path] = False  # an include cycle adds nothing
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return False
    found = bool(LOCKISH.search(text)) or any(
        touches_locks(os.path.join(root, h)) for h in INCLUDE.findall(text)
        if os.path.exists(os.path.join(root, h)))
    memo[path] = found
    return found


skipped = lock_free = 0
for entry in json.load(open(sys.argv[1])):
    if "/build-clang-tsa/" in entry["file"]:
        continue
    source = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    if source in covered:
        skipped += 1
        continue
    if not touches_locks(source):
        lock_free += 1
        continue
    args = shlex.split(entry["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c":
            out.append(a)
    cmd = "cd %s && %s -mavx512fp16 -Wno-unknown-warning-option -fsyntax-only" % (
        shlex.quote(entry["directory"]), shlex.join(out))
    sys.stdout.write(cmd + "\0")
if skipped:
    print("thread-safety.sh: %d sources already analysed by the fuzz build" % skipped,
          file=sys.stderr)
print("thread-safety.sh: %d sources name no lock, in themselves or their headers" % lock_free,
      file=sys.stderr)
EOF

count=$(tr -cd '\0' <"$build/tsa-commands" | wc -c)
echo "thread-safety.sh: analysing $count sources with clang++-14"
if ! xargs -0 -P "${THREAD_SAFETY_JOBS:-2}" -n 1 bash -c <"$build/tsa-commands"; then
  echo "thread-safety.sh: FAILED (thread-safety errors above)" >&2
  exit 1
fi
echo "thread-safety.sh: all $count sources analysed pass -Wthread-safety -Werror=thread-safety"
