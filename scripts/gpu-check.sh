#!/usr/bin/env bash
# Every GPU test and benchmark in one run, for a machine with an NVIDIA GPU
# that is lent for minutes: run from the repository root of a tree that
# holds .gpu/ (scripts/gpu-bundle.sh, made where the build is) or a CUDA
# build in build/. Writes RESULTS/results.json and RESULTS/results.md (the
# device's name, each step's outcome and time, the benchmark tables) and
# each step's log beside them; exits non-zero when a step failed.
#
#   scripts/gpu-check.sh [--dry-run] [--steps A,B,...] [RESULTS]   # default gpu-check/
#
# --steps runs only the named steps (cuda_create_test, cuda_backend_test,
# staged_workers_cuda_test, gpu_cluster_test, engine_bench, kv_bench,
# kv_nocma_bench, cluster_bench). kv_bench moves layers of the size the
# cluster benchmark ships (8 MiB: 2048 tokens of the 8B shape's bf16 KV)
# between two processes of this host over the transports the workers get;
# kv_nocma_bench the same without UCX's cross-memory-attach lane.
#
# --dry-run rehearses on a machine without a GPU: the same steps in the same
# order, the tests run (their GPU cases skip, which only a dry run allows),
# the engine benchmark on the CPU with a small shape, and the cluster
# benchmark on the CPU with stories15M, so that everything up to the first
# device call is checked. Budget on an H100: about 6 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0 only=""
while [[ "${1:-}" == --* ]]; do
  case $1 in
    --dry-run) dry=1 && shift ;;
    --steps) only=",$2," && shift 2 ;;
    *) echo "gpu-check: unknown option $1" >&2 && exit 2 ;;
  esac
done
results=$(mkdir -p "${1:-gpu-check}" && cd "${1:-gpu-check}" && pwd)
rm -f "$results"/*.log "$results"/*.xml "$results/results.json" "$results/results.md"
if [[ -f .gpu/bin.tar.xz && ! -x build/bin/gpu_cluster_test ]]; then
  # shellcheck source=scripts/gpu-env.sh
  source scripts/gpu-env.sh
fi
export TANDEM_MODELS=${TANDEM_MODELS:-$PWD/../shared/models} TANDEM_REQUIRE_MODELS=1
if ((dry)); then
  device="none (dry run)"
else
  device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
    head -1) || { echo "gpu-check: nvidia-smi failed: $device" >&2; exit 1; }
fi
echo "gpu-check: device: $device"

steps=()  # name|status|seconds|log
run_step() {  # run_step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  [[ -z "$only" || "$only" == *",$name,"* ]] || return 0
  local log="$results/$name.log" start status
  start=$(date +%s.%N)
  echo "== $name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  status=$?
  local seconds
  seconds=$(python3 -c "import sys,time; print('%.1f' % (time.time() - float(sys.argv[1])))" "$start")
  local outcome=passed
  if ((status == 124 || status == 137)); then
    outcome="timed out after ${limit}s"
  elif ((status != 0)); then
    outcome="failed (exit $status)"
  fi
  echo "   $outcome in ${seconds}s"
  ((status == 0)) || tail -20 "$log"
  steps+=("$name|$outcome|$seconds|$name.log")
}
gtest() {  # gtest NAME TIMEOUT_S: a test binary with its XML report
  run_step "$1" "$2" build/bin/"$1" --gtest_output="xml:$results/$1.xml" --gtest_brief=1
}

gtest cuda_create_test 60
gtest cuda_backend_test 180
gtest staged_workers_cuda_test 120
gtest gpu_cluster_test 240
kv_size=8MiB
((dry)) && kv_size=1MiB
kv=(build/bin/tandem-kvbench --perftest=false --sizes=$kv_size --layers=32 --lanes=1
    --checksums=off,on --repeats=1 --transfers=8 --warmup=2)
if ((dry)); then
  run_step engine_bench 300 build/bin/tandem-engine-bench --backend cpu --shapes stories15M \
    --dtype f32,bf16 --prompts 64 --batches 1,4 --decode_prompt 32 --decode_steps 4 --repeats 1
else
  run_step engine_bench 240 build/bin/tandem-engine-bench --backend cuda --shapes llama3-8b \
    --dtype bf16 --prompts 2048 --batches 1,8,32 --decode_prompt 1024 --decode_steps 32 --repeats 2
fi
run_step kv_bench 120 "${kv[@]}"
run_step kv_nocma_bench 120 env 'UCX_TLS=^posix,cma' "${kv[@]}"
if ((dry)); then
  run_step cluster_bench 600 env TANDEM_BENCH_SHAPE=stories15M TANDEM_BENCH_BACKEND=cpu \
    scripts/bench-gpu.sh cluster 4
else
  run_step cluster_bench 360 scripts/bench-gpu.sh cluster 40
fi

python3 - "$results" "$device" "$dry" "${steps[@]}" <<'PY'
import json, os, sys
import xml.etree.ElementTree as ET

results, device, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
steps = []
failed = False
for entry in sys.argv[4:]:
    name, outcome, seconds, log = entry.split("|")
    step = {"name": name, "outcome": outcome, "seconds": float(seconds), "log": log}
    xml = os.path.join(results, name + ".xml")
    if os.path.exists(xml):
        root = ET.parse(xml).getroot()
        cases = root.iter("testcase")
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        failures = []
        for case in cases:
            full = case.get("classname", "") + "." + case.get("name", "")
            if case.find("failure") is not None:
                counts["failed"] += 1
                failures.append(full)
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
        step["tests"] = counts
        step["failures"] = failures
        # On a device a skipped GPU case means the GPU was not found.
        if counts["failed"] or (counts["skipped"] and not dry):
            if outcome == "passed":
                step["outcome"] = "failed"
    text = open(os.path.join(results, log), errors="replace").read()
    if name.endswith("_bench"):
        step["output"] = [l for l in text.splitlines() if l.strip()]
    if step["outcome"] != "passed":
        failed = True
    steps.append(step)

summary = {"device": device, "dry_run": dry, "passed": not failed, "steps": steps}
json.dump(summary, open(os.path.join(results, "results.json"), "w"), indent=1)
md = [f"# gpu-check on {device}", "", "| step | outcome | tests passed/failed/skipped | seconds |",
      "|---|---|---|---:|"]
for s in steps:
    t = s.get("tests")
    counts = f"{t['passed']}/{t['failed']}/{t['skipped']}" if t else ""
    md.append(f"| {s['name']} | {s['outcome']} | {counts} | {s['seconds']:.1f} |")
for s in steps:
    if s.get("failures"):
        md += ["", f"{s['name']} failures: " + ", ".join(s["failures"])]
for s in steps:
    if "output" in s:
        md += ["", f"## {s['name']}", "", "```"] + s["output"] + ["```"]
open(os.path.join(results, "results.md"), "w").write("\n".join(md) + "\n")
print("gpu-check:", "passed" if not failed else "FAILED", "-", os.path.join(results, "results.md"))
sys.exit(1 if failed else 0)
PY
