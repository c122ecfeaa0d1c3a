#!/usr/bin/env bash
# Checks deploy/helm/tandem without a cluster or helm:
#  - render/ (Go, text/template + Sprig, built here into WORK_DIR) renders
#    the chart for the default values, for each values/*.yaml, and under a
#    long release name in another namespace;
#  - each rendering: yamllint (the chart's .yamllint), the coalesced values
#    against values.schema.json, every object against the Kubernetes API
#    schemas of the npm package kubernetes-models (the ServiceMonitor against
#    @kubernetes-models/prometheus-operator's), unknown fields refused, the
#    cross-object checks of check.mjs and values/NAME.expect.json, and every
#    flag passed to tandem-router, tandem-prefill, tandem-decode and tandem-planner against
#    their --helpfull, the arguments parsed by the binary itself;
#  - each bad-values/*.yaml fails where its "# expect:" line says: the
#    schema, the rendering (with that message) or the flag check;
#  - each rendering's Grafana dashboard and PrometheusRule (observability.mjs):
#    there exactly when the values turn them on, the dashboard's JSON
#    parsed, the rules well-formed with runbook sections that
#    docs/operations.md has, every metric name one the C++ source registers
#    (tests/deploy/observability/metric_names.py); with a promtool on PATH,
#    also promtool check rules, and promtool test rules on alerts_test.yaml
#    (skipped when there is none);
#  - with a helm on PATH, also helm lint --strict and helm template, whose
#    output gets the same object checks (skipped when there is none).
# The npm packages are installed into CACHE_DIR/npm-kubernetes-models on
# first use. A missing tool fails the test; an npm registry that cannot be
# reached skips it.
# Usage: chart_test.sh CHART_DIR BIN_DIR WORK_DIR CACHE_DIR
set -uo pipefail
[ $# -eq 4 ] || { echo "usage: chart_test.sh CHART_DIR BIN_DIR WORK_DIR CACHE_DIR"; exit 2; }
mkdir -p "$3" "$4" || { echo "FAIL: cannot create $3 or $4"; exit 1; }
chart="$(cd "$1" && pwd)"
bin="$(cd "$2" && pwd)"
work="$(cd "$3" && pwd)"
cache="$(cd "$4" && pwd)/npm-kubernetes-models"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
packages=(kubernetes-models@4.5.1 @kubernetes-models/prometheus-operator@4.4.4 ajv@8.20.0)
failures=0
passes=0

fail() {
  echo "FAIL: $*"
  exit 1
}
check() { # check NAME COMMAND...: runs it, counts it, shows its output on failure.
  local name="$1"
  shift
  local out
  if out=$("$@" 2>&1); then
    passes=$((passes + 1))
  else
    failures=$((failures + 1))
    echo "FAIL: $name"
    echo "$out" | tail -n 40
  fi
}

for program in go node npm yamllint python3; do
  command -v "$program" >/dev/null ||
    fail "$program is not in PATH (scripts/install-deps.sh installs golang-go, nodejs, npm and yamllint)"
done
for dir in github.com/Masterminds/sprig sigs.k8s.io/yaml; do
  [ -d "/usr/share/gocode/src/$dir" ] ||
    fail "/usr/share/gocode/src/$dir is missing (scripts/install-deps.sh installs golang-github-masterminds-sprig-dev and golang-k8s-sigs-yaml-dev)"
done
for binary in tandem-router tandem-prefill tandem-decode tandem-planner; do
  [ -x "$bin/$binary" ] || fail "$bin/$binary is missing: build it first"
done

mkdir -p "$work/out" || fail "cannot create $work"
rm -rf "${work:?}/out"/*

# The metrics the binaries register, from the source: the dashboard's and
# the alerts' names must be among them.
python3 "$root/tests/deploy/observability/metric_names.py" source --root "$root" \
  >"$work/metric-names.json" 2>"$work/metric-names.err" ||
  fail "reading the metric names from the source failed: $(cat "$work/metric-names.err")"

# The renderer, from the Debian Go packages only (GOPATH mode, no modules).
(cd "$here/render" && GO111MODULE=off GOPATH="$work/gopath:/usr/share/gocode" GOCACHE="$work/gocache" \
  GOFLAGS= GOPROXY=off go build -o "$work/render" .) >"$work/go-build.log" 2>&1 ||
  fail "building $here/render failed:
$(cat "$work/go-build.log")"

# The Kubernetes schemas and ajv, pinned; reinstalled when the cache holds
# other versions.
installed=$(cd "$cache" 2>/dev/null && node -p "['kubernetes-models','@kubernetes-models/prometheus-operator','ajv']
  .map((p) => p + '@' + require('./node_modules/' + p + '/package.json').version).join(' ')" 2>/dev/null)
if [ "$installed" != "${packages[*]}" ]; then
  mkdir -p "$cache" || fail "cannot create $cache"
  if ! timeout 180 npm install --prefix "$cache" --no-audit --no-fund --no-save "${packages[@]}" \
    >"$cache/install.log" 2>&1; then
    if ! timeout 30 npm ping >/dev/null 2>&1; then
      echo "SKIP: the npm registry cannot be reached to install ${packages[*]}"
      exit 77
    fi
    fail "npm install ${packages[*]} into $cache failed:
$(tail -n 20 "$cache/install.log")"
  fi
fi
modules="$cache/node_modules"

lint_config="$chart/.yamllint"
values_lint="{extends: $lint_config, rules: {document-start: disable}}"
check "yamllint of Chart.yaml, values.yaml and the test values" \
  yamllint -s -d "$values_lint" "$chart/Chart.yaml" "$chart/values.yaml" "$here"/values/*.yaml \
  "$here"/bad-values/*.yaml
check "values.schema.json is JSON" python3 -m json.tool "$chart/values.schema.json"

# render_case NAME EXPECT [RENDER ARGS...]: a good rendering, checked whole.
render_case() {
  local name="$1" expect="$2"
  shift 2
  local out="$work/out/$name"
  if ! "$work/render" "$@" --json_out "$out.json" --values_out "$out.values.json" \
    --notes_out "$out.notes" "$chart" >"$out.yaml" 2>"$out.err"; then
    failures=$((failures + 1))
    echo "FAIL: $name: rendering failed: $(cat "$out.err")"
    return
  fi
  echo "$name: $(grep -c '^# Source:' "$out.yaml") objects rendered"
  check "$name: yamllint" yamllint -s -c "$lint_config" "$out.yaml"
  check "$name: values schema" node "$here/check.mjs" values "$modules" "$chart/values.schema.json" \
    "$out.values.json"
  check "$name: objects" node "$here/check.mjs" manifests "$modules" "$out.json" $expect
  check "$name: flags" node "$here/check.mjs" flags "$out.json" "$bin"
  check "$name: NOTES.txt" grep -q "headless Service" "$out.notes"
  check "$name: dashboard and alerts" node "$here/observability.mjs" "$out.json" "$out.values.json" \
    "$work/metric-names.json" "$root/docs/operations.md"
  if command -v promtool >/dev/null && grep -q '"kind": "PrometheusRule"' "$out.json"; then
    node -e 'const o = require(process.argv[1]).find((m) => m.object.kind === "PrometheusRule").object;
      console.log(JSON.stringify({groups: o.spec.groups}, null, 1))' "$out.json" >"$out.rules.yaml"
    check "$name: promtool check rules" promtool check rules "$out.rules.yaml"
  fi
}

render_case default "$here/values/default.expect.json"
for values in "$here"/values/*.yaml; do
  name=$(basename "$values" .yaml)
  render_case "$name" "$here/values/$name.expect.json" -f "$values"
done
render_case long-release-name "" --name release-name-of-fifty-three-characters-helm-s-longest \
  --namespace serving -f "$here/values/gpu-scaled.yaml"

# The alerts on series made to trip each one, and not the others
# (alerts_test.yaml, over the rules of values/observability.yaml).
if command -v promtool >/dev/null; then
  cp "$here/alerts_test.yaml" "$work/out/alerts_test.yaml"
  cp "$work/out/observability.rules.yaml" "$work/out/alerts_rules.yaml" 2>/dev/null
  check "promtool test rules alerts_test.yaml" promtool test rules "$work/out/alerts_test.yaml"
else
  echo "promtool is not in PATH: promtool check rules and test rules skipped"
fi

# Chart.yaml's kubeVersion: the preStop sleep action needs Kubernetes 1.30.
if "$work/render" --kube_version v1.29.4 "$chart" >/dev/null 2>"$work/out/kube-1.29.err"; then
  failures=$((failures + 1))
  echo "FAIL: the chart rendered for Kubernetes 1.29"
elif grep -q "incompatible with Kubernetes v1.29.4" "$work/out/kube-1.29.err"; then
  passes=$((passes + 1))
else
  failures=$((failures + 1))
  echo "FAIL: Kubernetes 1.29: $(cat "$work/out/kube-1.29.err")"
fi

# Bad values, each refused where its "# expect:" line says.
for values in "$here"/bad-values/*.yaml; do
  name="bad-$(basename "$values" .yaml)"
  out="$work/out/$name"
  expect=$(sed -n 's/^# expect: //p' "$values" | head -n 1)
  "$work/render" -f "$values" --json_out "$out.json" --values_out "$out.values.json" "$chart" \
    >"$out.yaml" 2>"$out.err"
  rendered=$?
  node "$here/check.mjs" values "$modules" "$chart/values.schema.json" "$out.values.json" >"$out.schema" 2>&1
  schema=$?
  case "$expect" in
    schema)
      if [ "$schema" -eq 3 ]; then
        passes=$((passes + 1))
        echo "$name: refused by the schema: $(sed -n '1s/^[^:]*: //p' "$out.schema")"
      else
        failures=$((failures + 1))
        echo "FAIL: $name: values.schema.json accepted it (exit $schema): $(cat "$out.schema")"
      fi
      ;;
    render:*)
      message="${expect#render: }"
      if [ "$schema" -ne 0 ]; then
        failures=$((failures + 1))
        echo "FAIL: $name: the schema should pass it, the template refuse it: $(cat "$out.schema")"
      elif [ "$rendered" -eq 0 ] || ! grep -qF "$message" "$out.err"; then
        failures=$((failures + 1))
        echo "FAIL: $name: rendering should fail with '$message' (exit $rendered): $(cat "$out.err")"
      else
        passes=$((passes + 1))
        echo "$name: refused by the template: $(tail -c 160 "$out.err")"
      fi
      ;;
    flags)
      node "$here/check.mjs" flags "$out.json" "$bin" >"$out.flags" 2>&1
      if [ "$schema" -ne 0 ] || [ "$rendered" -ne 0 ]; then
        failures=$((failures + 1))
        echo "FAIL: $name: schema (exit $schema) and rendering (exit $rendered) should pass it"
      elif ! grep -qE "is not a flag of|refuses its arguments" "$out.flags"; then
        failures=$((failures + 1))
        echo "FAIL: $name: the flag check accepted it: $(cat "$out.flags")"
      else
        passes=$((passes + 1))
        echo "$name: refused by the flag check: $(grep -m1 -E 'is not a flag|refuses' "$out.flags")"
      fi
      ;;
    *)
      failures=$((failures + 1))
      echo "FAIL: $values has no '# expect: schema|render: MESSAGE|flags' line"
      ;;
  esac
done

# A real helm, where there is one.
if command -v helm >/dev/null; then
  check "helm lint --strict" helm lint --strict "$chart"
  for values in "" "$here"/values/*.yaml; do
    name="helm-$(basename "${values:-default}" .yaml)"
    if helm template tandem "$chart" ${values:+-f "$values"} >"$work/out/$name.yaml" 2>"$work/out/$name.err"; then
      python3 -c 'import json, sys, yaml
print(json.dumps([{"source": "helm template", "object": d} for d in yaml.safe_load_all(sys.stdin) if d]))' \
        <"$work/out/$name.yaml" >"$work/out/$name.json"
      check "$name: objects" node "$here/check.mjs" manifests "$modules" "$work/out/$name.json"
      check "$name: flags" node "$here/check.mjs" flags "$work/out/$name.json" "$bin"
    else
      failures=$((failures + 1))
      echo "FAIL: $name: $(cat "$work/out/$name.err")"
    fi
  done
  for values in "$here"/bad-values/*.yaml; do
    grep -q '^# expect: flags' "$values" && continue
    if helm template tandem "$chart" -f "$values" >/dev/null 2>&1; then
      failures=$((failures + 1))
      echo "FAIL: helm template accepted $values"
    else
      passes=$((passes + 1))
    fi
  done
else
  echo "helm is not in PATH: helm lint and helm template skipped (the renderer stands in for them)"
fi

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
