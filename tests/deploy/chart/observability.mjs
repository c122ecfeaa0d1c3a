// The chart's Grafana dashboard and alert rules, rendered, checked offline.
// Usage:
//
//   node observability.mjs OBJECTS.json VALUES.json NAMES.json OPERATIONS.md
//
// OBJECTS.json is tests/deploy/chart/render's --json_out, VALUES.json its
// --values_out (the coalesced values), NAMES.json the metrics the binaries
// register (tests/deploy/observability/metric_names.py source) and
// OPERATIONS.md the runbook the alerts point to (docs/operations.md).
//
// With dashboards.enabled: one ConfigMap labelled dashboards.label =
// dashboards.labelValue holds tandem.json, which parses and is a dashboard
// (unique panel ids, panels on the 24-column grid without overlaps, every
// query on the data source variable and filtered by the namespace
// variable, balanced brackets), whose TTFT and TPOT panels draw the SLOs of
// planner.ttftP99 / planner.tpotP99 as thresholds (and no threshold where
// none is set). With alerts.enabled: one PrometheusRule whose rules each
// have a unique alert name, an expression whose every series carries the
// release's selector, a `for`, a severity, alerts.ruleLabels, a summary,
// a description and a runbook_url of alerts.runbookUrl plus a section that
// OPERATIONS.md has. Every tandem_* name either uses is a registered
// metric (a histogram's _bucket, _sum and _count its series). Without
// them: no such ConfigMap or PrometheusRule.
import { readFileSync } from "node:fs";

const problems = [];
const problem = (where, what) => problems.push(`${where}: ${what}`);
const readJson = (path) => JSON.parse(readFileSync(path, "utf8"));

const [objectsPath, valuesPath, namesPath, docsPath] = process.argv.slice(2);
if (!docsPath) {
  console.error("usage: observability.mjs OBJECTS.json VALUES.json NAMES.json OPERATIONS.md");
  process.exit(2);
}
const objects = readJson(objectsPath).map((m) => m.object);
const values = readJson(valuesPath);
const registered = new Map(readJson(namesPath).map((m) => [m.name, m.type]));

// --- Metric names ----------------------------------------------------------

const NAME = /(?<![A-Za-z0-9_])tandem_[a-z0-9_]+/g;
function checkNames(where, text) {
  const names = new Set(text.match(NAME) ?? []);
  for (const name of names) {
    if (registered.has(name)) continue;
    const series = ["_bucket", "_sum", "_count"].find((s) => name.endsWith(s));
    const base = series && name.slice(0, -series.length);
    if (!base || registered.get(base) !== "histogram") {
      problem(where, `${name} is not a metric the binaries register`);
    }
  }
  return names.size;
}

function checkBrackets(where, expr) {
  const open = { "(": ")", "[": "]", "{": "}" };
  const stack = [];
  let quoted = false;
  for (let i = 0; i < expr.length; i++) {
    const c = expr[i];
    if (c === '"' && expr[i - 1] !== "\\") quoted = !quoted;
    if (quoted) continue;
    if (open[c]) stack.push(open[c]);
    else if (")]}".includes(c) && stack.pop() !== c) return problem(where, `unbalanced '${c}' in ${expr}`);
  }
  if (stack.length || quoted) problem(where, `unclosed brackets or quotes in ${expr}`);
}

// Every series selector in `expr` starts with `selector` (a metric name
// followed by its braces).
function checkSelectors(where, expr, selector) {
  for (const m of expr.matchAll(/(?<![A-Za-z0-9_])(tandem_[a-z0-9_]+)(\{?)/g)) {
    if (m[2] !== "{" || !expr.startsWith(selector, m.index + m[0].length)) {
      problem(where, `${m[1]} is not filtered by {${selector}...}`);
    }
  }
}

// --- The dashboard ---------------------------------------------------------

const seconds = (d) => {
  const m = /^([0-9]+)(ms|s|m|h)$/.exec(d ?? "");
  return m ? Number(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]] : undefined;
};

function checkDashboard() {
  const { label, labelValue } = values.dashboards;
  const maps = objects.filter((o) => o.kind === "ConfigMap" && o.data?.["tandem.json"] !== undefined);
  if (!values.dashboards.enabled) {
    if (maps.length) problem("dashboards", "a dashboard ConfigMap is rendered with dashboards.enabled false");
    return "no dashboard (off)";
  }
  if (maps.length !== 1) return problem("dashboards", `${maps.length} dashboard ConfigMaps rendered, 1 expected`);
  const map = maps[0];
  const where = `ConfigMap/${map.metadata.name}`;
  if (map.metadata.labels?.[label] !== labelValue) {
    problem(where, `label ${label} is ${map.metadata.labels?.[label]}, not "${labelValue}" (Grafana's sidecar selects by it)`);
  }
  let d;
  try {
    d = JSON.parse(map.data["tandem.json"]);
  } catch (e) {
    return problem(where, `tandem.json is not JSON: ${e.message}`);
  }
  if (!d.title || !d.uid || !Array.isArray(d.panels) || d.panels.length === 0) {
    problem(where, "tandem.json lacks a title, a uid or panels");
    return;
  }
  const variables = new Set((d.templating?.list ?? []).map((v) => v.name));
  for (const v of ["datasource", "namespace"]) if (!variables.has(v)) problem(where, `no $${v} variable`);
  const ids = new Set();
  const cells = new Map();
  let queries = 0;
  const slo = {
    tandem_router_time_to_first_token_seconds: seconds(values.planner?.ttftP99),
    tandem_router_time_per_output_token_seconds: seconds(values.planner?.tpotP99),
  };
  const sloPanels = new Set();
  for (const p of d.panels) {
    const at = `${where} panel ${p.id} '${p.title}'`;
    if (ids.has(p.id)) problem(at, "id used twice");
    ids.add(p.id);
    const { x, y, w, h } = p.gridPos ?? {};
    if (![x, y, w, h].every(Number.isInteger) || x < 0 || w < 1 || x + w > 24 || h < 1) {
      problem(at, `gridPos ${JSON.stringify(p.gridPos)} is off the 24-column grid`);
    } else {
      for (let r = y; r < y + h; r++) {
        for (let c = x; c < x + w; c++) {
          const key = `${r},${c}`;
          if (cells.has(key)) problem(at, `overlaps panel ${cells.get(key)}`);
          cells.set(key, p.id);
        }
      }
    }
    if (p.type === "row") continue;
    if (!p.title || !p.description) problem(at, "needs a title and a description");
    if (p.datasource?.uid !== "${datasource}") problem(at, "does not read the $datasource variable");
    if (!p.targets?.length) problem(at, "has no queries");
    for (const t of p.targets ?? []) {
      queries++;
      if (!t.expr) problem(at, `query ${t.refId} has no expression`);
      checkBrackets(at, t.expr ?? "");
      checkSelectors(at, t.expr ?? "", 'namespace=~"$namespace"');
    }
    const steps = p.fieldConfig?.defaults?.thresholds?.steps ?? [];
    const exprs = JSON.stringify(p.targets ?? []);
    for (const [metric, s] of Object.entries(slo)) {
      if (!exprs.includes(metric)) continue;
      sloPanels.add(metric);
      const lines = steps.filter((x) => x.value !== null);
      const style = p.fieldConfig.defaults.custom?.thresholdsStyle?.mode;
      if (s === undefined && (lines.length || style !== "off")) problem(at, "draws an SLO the values do not set");
      if (s !== undefined && (lines.length !== 1 || Math.abs(lines[0].value - s) > 1e-9 || style === "off")) {
        problem(at, `does not draw the SLO ${s}s as a threshold line: ${JSON.stringify(steps)}, style ${style}`);
      }
    }
  }
  for (const metric of Object.keys(slo)) if (!sloPanels.has(metric)) problem(where, `no panel of ${metric}`);
  const names = checkNames(where, map.data["tandem.json"]);
  return `dashboard: ${d.panels.length} panels, ${queries} queries over ${names} metric names`;
}

// --- The alert rules -------------------------------------------------------

// The anchors GitHub gives the headings of a Markdown page.
function anchors(markdown) {
  const out = new Set();
  const seen = new Map();
  let fenced = false;
  for (const line of markdown.split("\n")) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    const m = !fenced && /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const slug = m[1]
      .replace(/`|\*\*|\*|_(?=\w)|(?<=\w)_/g, "")
      .toLowerCase()
      .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
      .replace(/[^\p{L}\p{N}_\- ]/gu, "")
      .replace(/ /g, "-");
    const k = seen.get(slug) ?? 0;
    seen.set(slug, k + 1);
    out.add(k ? `${slug}-${k}` : slug);
  }
  return out;
}

function checkAlerts() {
  const rules = objects.filter((o) => o.kind === "PrometheusRule");
  if (!values.alerts.enabled) {
    if (rules.length) problem("alerts", "a PrometheusRule is rendered with alerts.enabled false");
    return "no alert rules (off)";
  }
  if (rules.length !== 1) return problem("alerts", `${rules.length} PrometheusRules rendered, 1 expected`);
  const rule = rules[0];
  const where = `PrometheusRule/${rule.metadata.name}`;
  const sections = anchors(readFileSync(docsPath, "utf8"));
  const groups = rule.spec?.groups ?? [];
  // alerts.selector, or the release's (its namespace and its jobs), the
  // same in every expression.
  const exprs = groups.flatMap((g) => (g.rules ?? []).map((r) => r.expr ?? "")).join("\n");
  const first = /tandem_[a-z0-9_]+\{([^}]*)\}/.exec(exprs)?.[1] ?? "";
  const own = /^namespace="[a-z0-9-]+",job=~"[a-z0-9-]+-\[a-z\]\+"/.exec(first)?.[0];
  const selector = values.alerts.selector || own;
  if (!selector) problem(where, `the release's selector is not namespace="...",job=~"FULLNAME-[a-z]+": ${first}`);
  const names = new Set();
  let metricNames = 0;
  if (groups.length === 0) problem(where, "no rule groups");
  for (const g of groups) {
    if (!g.name || !g.rules?.length) problem(where, `group '${g.name}' has no name or no rules`);
    for (const r of g.rules ?? []) {
      const at = `${where} ${r.alert ?? r.record}`;
      if (!/^Tandem[A-Z][A-Za-z]+$/.test(r.alert ?? "")) problem(at, "is not an alert named Tandem...");
      if (names.has(r.alert)) problem(at, "alert name used twice");
      names.add(r.alert);
      if (typeof r.expr !== "string" || !r.expr.trim()) problem(at, "has no expression");
      if (/\{\{|\}\}/.test(r.expr ?? "")) problem(at, "has template braces left in its expression");
      checkBrackets(at, r.expr ?? "");
      checkSelectors(at, r.expr ?? "", selector);
      metricNames += checkNames(at, r.expr ?? "");
      if (!/^[0-9]+(ms|s|m|h)$/.test(r.for ?? "")) problem(at, `for is '${r.for}'`);
      if (!["critical", "warning", "info"].includes(r.labels?.severity)) problem(at, "no severity label");
      for (const [k, v] of Object.entries(values.alerts.ruleLabels ?? {})) {
        if (r.labels?.[k] !== v) problem(at, `lacks alerts.ruleLabels' ${k}: ${v}`);
      }
      const a = r.annotations ?? {};
      if (!a.summary || !a.description) problem(at, "needs a summary and a description");
      const [base, section] = (a.runbook_url ?? "").split("#");
      if (base !== values.alerts.runbookUrl) problem(at, `runbook_url ${a.runbook_url} is not under alerts.runbookUrl`);
      if (section !== r.alert?.toLowerCase()) problem(at, `runbook_url names section '${section}', not the alert's`);
      else if (!sections.has(section)) problem(at, `${docsPath} has no section #${section}`);
    }
  }
  return `alerts: ${names.size} rules in ${groups.length} groups over ${metricNames} metric names`;
}

const summary = [checkDashboard(), checkAlerts()].filter(Boolean).join("; ");
for (const p of problems) console.log(`FAIL ${p}`);
if (problems.length > 0) process.exit(1);
console.log(summary);
