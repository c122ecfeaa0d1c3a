// Offline checks of the tandem chart's rendered objects and of its values
// schema. Usage (NODE_MODULES holds kubernetes-models,
// @kubernetes-models/prometheus-operator and ajv):
//
//   node check.mjs manifests NODE_MODULES OBJECTS.json [EXPECT.json]
//       every object against the Kubernetes API schema of its kind (the
//       ServiceMonitor against the Prometheus Operator's CRD schema), with
//       fields the schema does not know refused as the API server's strict
//       field validation refuses them; then what the API server or the
//       cluster would trip on and the schema cannot say (names, selectors,
//       ports, probes, drain time against the grace period, the router's
//       worker targets); then EXPECT.json's expectations.
//   node check.mjs flags OBJECTS.json BIN_DIR
//       every --flag a container passes to a tandem binary is one that
//       binary's --helpfull lists, and the binary parses the arguments.
//   node check.mjs values NODE_MODULES SCHEMA.json VALUES.json
//       the values against values.schema.json (draft-07, as helm checks
//       them); exit 3 with the reasons when they do not conform.
//
// OBJECTS.json is tests/deploy/chart/render's --json_out: [{source, object}].
import { readFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { resolve } from "node:path";

const problems = [];
const problem = (where, what) => problems.push(`${where}: ${what}`);
const readJson = (path) => JSON.parse(readFileSync(path, "utf8"));
const idOf = (o) => `${o.kind}/${o.metadata?.name}`;

// --- Schemas -----------------------------------------------------------

function modelPath(apiVersion, kind) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return `@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${kind}`;
  }
  return `kubernetes-models/${apiVersion}/${kind}`;
}

// Wraps `value` so that every property the validator reads is recorded;
// an object of which the validator read some properties but not all has
// fields its schema does not define. (Objects it read nothing of are free
// form, or already reported as the wrong type.)
function tracked(value, path, records) {
  if (value === null || typeof value !== "object") return value;
  const read = new Set();
  const children = new Map();
  records.push({ path, value, read });
  return new Proxy(value, {
    get(target, key, receiver) {
      if (typeof key !== "string" || !Object.hasOwn(target, key)) {
        if (typeof key === "string") read.add(key);
        return Reflect.get(target, key, receiver);
      }
      read.add(key);
      if (!children.has(key)) {
        children.set(key, tracked(target[key], `${path}/${key}`, records));
      }
      return children.get(key);
    },
  });
}

function checkSchema(require, object, where) {
  let model;
  try {
    model = require(modelPath(object.apiVersion, object.kind))[object.kind];
  } catch (e) {
    problem(where, `no schema for apiVersion ${object.apiVersion} kind ${object.kind}`);
    return;
  }
  const records = [];
  try {
    model.prototype.validate.call(tracked(object, "", records));
  } catch (e) {
    const details = (e.errors ?? []).map((x) => `${x.instancePath || "/"} ${x.message}`);
    problem(where, `schema: ${details.join("; ") || e.message}`);
  }
  for (const { path, value, read } of records) {
    if (Array.isArray(value) || read.size === 0) continue;
    for (const key of Object.keys(value)) {
      if (!read.has(key)) problem(where, `unknown field ${path}/${key}`);
    }
  }
}

// --- What the schema cannot say ----------------------------------------

const dns1123Label = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const labelValue = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const portName = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

function matchesSelector(selector, labels) {
  if (!matches(selector.matchLabels, labels)) return false;
  return (selector.matchExpressions ?? []).every(({ key, operator, values }) => {
    if (operator === "In") return values.includes(labels?.[key]);
    if (operator === "NotIn") return !values.includes(labels?.[key]);
    if (operator === "Exists") return labels?.[key] !== undefined;
    return labels?.[key] === undefined;
  });
}

const seconds = (duration) => {
  const m = /^(\d+)s$/.exec(duration ?? "");
  return m ? Number(m[1]) : undefined;
};

function argValue(args, name) {
  const prefix = `--${name}=`;
  const arg = (args ?? []).find((a) => a.startsWith(prefix));
  return arg?.slice(prefix.length);
}

function checkSemantics(objects) {
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const deployments = byKind("Deployment");
  const services = byKind("Service");
  const seen = new Set();
  for (const o of objects) {
    const id = idOf(o);
    if (seen.has(id)) problem(id, "rendered twice");
    seen.add(id);
    const name = o.metadata?.name ?? "";
    if (!dns1123Label.test(name) || name.length > 63) {
      problem(id, "name is not a DNS-1123 label of at most 63 characters");
    }
    for (const [k, v] of Object.entries(o.metadata?.labels ?? {})) {
      if (typeof v !== "string" || v.length > 63 || !labelValue.test(v)) {
        problem(id, `label ${k} has an invalid value '${v}'`);
      }
    }
  }

  const podsOf = new Map(); // Deployment name -> its pod template.
  for (const d of deployments) {
    const id = idOf(d);
    const pod = d.spec.template;
    podsOf.set(d.metadata.name, pod);
    if (!matchesSelector(d.spec.selector, pod.metadata?.labels)) {
      problem(id, "selector does not match the pod template's labels");
    }
    const volumes = new Set((pod.spec.volumes ?? []).map((v) => v.name));
    for (const c of [...(pod.spec.initContainers ?? []), ...pod.spec.containers]) {
      const where = `${id} container ${c.name}`;
      const ports = new Map();
      for (const p of c.ports ?? []) {
        if (p.name !== undefined && (p.name.length > 15 || !portName.test(p.name))) {
          problem(where, `port name '${p.name}' is not an IANA service name`);
        }
        if (ports.has(p.name)) problem(where, `port name ${p.name} twice`);
        ports.set(p.name, p.containerPort);
      }
      for (const m of c.volumeMounts ?? []) {
        if (!volumes.has(m.name)) problem(where, `mounts volume ${m.name}, which the pod lacks`);
      }
      for (const kind of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const probe = c[kind];
        if (!probe) continue;
        const port = probe.grpc?.port ?? probe.tcpSocket?.port ?? probe.httpGet?.port;
        if (![...ports.values()].includes(port) && !ports.has(port)) {
          problem(where, `${kind} probes port ${port}, which the container does not expose`);
        }
      }
      const limits = c.resources?.limits ?? {};
      const requests = c.resources?.requests ?? {};
      for (const key of Object.keys({ ...limits, ...requests })) {
        if (key.includes("/") && String(limits[key]) !== String(requests[key])) {
          problem(where, `extended resource ${key}: requests and limits must be equal`);
        }
      }
      const gpus = Number(limits["nvidia.com/gpu"] ?? 0);
      if (c.command?.[0]?.match(/^tandem-(prefill|decode)$/)) {
        const backend = argValue(c.args, "backend");
        if ((gpus > 0) !== (backend === "cuda")) {
          problem(where, `${gpus} GPUs but --backend=${backend}`);
        }
        if (gpus > 0 && !/\/?tandem-cuda:/.test(c.image)) {
          problem(where, `a GPU worker runs ${c.image}, not the CUDA image`);
        }
        const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value]));
        if (env.UCX_NET_DEVICES !== argValue(c.args, "kv_net_devices")) {
          problem(where, "UCX_NET_DEVICES and --kv_net_devices differ");
        }
      }
      if (/^tandem-(router|prefill|decode)$/.test(c.command?.[0] ?? "")) {
        const drain = seconds(argValue(c.args, "drain_timeout"));
        const sleep = c.lifecycle?.preStop?.sleep?.seconds ?? 0;
        const grace = pod.spec.terminationGracePeriodSeconds ?? 30;
        if (drain === undefined) problem(where, "no --drain_timeout in seconds");
        else if (grace <= drain + sleep) {
          problem(where, `grace period ${grace}s is not longer than preStop ${sleep}s + drain ${drain}s`);
        }
        // The router listens only once a decode worker is healthy, within
        // --startup_timeout; the workers once the model is loaded.
        const startup = c.startupProbe;
        const startupTimeout = seconds(argValue(c.args, "startup_timeout"));
        if (!startup) problem(where, "no startup probe");
        else if (startupTimeout !== undefined &&
                 (startup.periodSeconds ?? 10) * (startup.failureThreshold ?? 3) <= startupTimeout) {
          problem(where, `the startup probe gives up before --startup_timeout=${startupTimeout}s`);
        }
        for (const flag of ["prefill_workers", "decode_workers"]) {
          const target = argValue(c.args, flag);
          if (target === undefined) continue;
          const [host, port] = target.split(":");
          const svc = services.find((s) => host.startsWith(`${s.metadata.name}.`));
          if (!svc) {
            problem(where, `--${flag}=${target} names no rendered Service`);
          } else if (svc.spec.clusterIP !== "None" || svc.spec.publishNotReadyAddresses !== false) {
            problem(where, `--${flag} names ${svc.metadata.name}, which is not headless with ready pods only`);
          } else if (!svc.spec.ports.some((p) => String(p.port) === port)) {
            problem(where, `--${flag}=${target}: the Service has no port ${port}`);
          }
        }
      }
    }
  }

  const podsMatching = (selector) =>
    [...podsOf.entries()].filter(([, pod]) => matchesSelector(selector, pod.metadata?.labels));
  for (const s of services) {
    const pods = podsMatching({ matchLabels: s.spec.selector });
    if (pods.length === 0) problem(idOf(s), "selects no rendered pods");
    for (const [name, pod] of pods) {
      const names = pod.spec.containers.flatMap((c) => (c.ports ?? []).map((p) => p.name));
      for (const p of s.spec.ports) {
        if (typeof p.targetPort === "string" && !names.includes(p.targetPort)) {
          problem(idOf(s), `targetPort ${p.targetPort} is no port of ${name}'s pods`);
        }
      }
    }
  }
  for (const b of byKind("PodDisruptionBudget")) {
    if (podsMatching(b.spec.selector).length !== 1) problem(idOf(b), "does not select one Deployment's pods");
  }
  for (const n of byKind("NetworkPolicy")) {
    if (podsMatching(n.spec.podSelector).length === 0) problem(idOf(n), "applies to no rendered pods");
    for (const rule of n.spec.ingress ?? []) {
      for (const peer of rule.from ?? []) {
        if (peer.podSelector && !peer.namespaceSelector && podsMatching(peer.podSelector).length === 0) {
          problem(idOf(n), "a podSelector peer matches no rendered pods");
        }
      }
    }
  }
  for (const h of byKind("HorizontalPodAutoscaler")) {
    const target = deployments.find((d) => d.metadata.name === h.spec.scaleTargetRef.name);
    if (!target) problem(idOf(h), "scales no rendered Deployment");
    else if (target.spec.replicas !== undefined) {
      problem(idOf(h), `${idOf(target)} sets replicas, which would fight the autoscaler`);
    }
    if ((h.spec.minReplicas ?? 1) > h.spec.maxReplicas) problem(idOf(h), "minReplicas > maxReplicas");
  }
  checkPlanner(byKind, podsOf);
  for (const m of byKind("ServiceMonitor")) {
    const selected = services.filter((s) => matchesSelector(m.spec.selector, s.metadata.labels));
    for (const e of m.spec.endpoints) {
      if (!selected.some((s) => s.spec.ports.some((p) => p.name === e.port))) {
        problem(idOf(m), `no selected Service has a port named ${e.port}`);
      }
      // Every Deployment's pods scraped, and once: a pod behind two such
      // Services would count twice in every sum.
      const scraped = new Map();
      for (const svc of selected.filter((x) => x.spec.ports.some((p) => p.name === e.port))) {
        for (const [name] of podsMatching({ matchLabels: svc.spec.selector })) {
          scraped.set(name, (scraped.get(name) ?? 0) + 1);
        }
      }
      for (const name of podsOf.keys()) {
        const n = scraped.get(name) ?? 0;
        if (n !== 1) problem(idOf(m), `scrapes Deployment/${name}'s pods ${n} times`);
      }
    }
    if (selected.length === 0) problem(idOf(m), "selects no rendered Service");
  }
}

// The planner's rights and targets: a Role grants only get and patch of
// the pools' Deployments' scale subresource, is bound to a rendered
// ServiceAccount that the planner's pod runs as, and names exactly the
// Deployments --kube_deployments scales; a pod without those rights mounts
// no token; --router_metrics names a headless Service of the routers.
function checkPlanner(byKind, podsOf) {
  const deployments = new Set(byKind("Deployment").map((d) => d.metadata.name));
  const accounts = new Set(byKind("ServiceAccount").map((a) => a.metadata.name));
  const roles = new Map(byKind("Role").map((r) => [r.metadata.name, r]));
  if (byKind("ClusterRole").length + byKind("ClusterRoleBinding").length > 0) {
    problem("RBAC", "the chart needs no cluster-wide rights");
  }
  const granted = new Map(); // ServiceAccount -> Deployments it may scale
  for (const b of byKind("RoleBinding")) {
    const role = roles.get(b.roleRef.name);
    if (b.roleRef.kind !== "Role" || !role) problem(idOf(b), `binds ${b.roleRef.kind}/${b.roleRef.name}, not a rendered Role`);
    for (const subject of b.subjects ?? []) {
      if (subject.kind !== "ServiceAccount" || !accounts.has(subject.name)) {
        problem(idOf(b), `binds ${subject.kind}/${subject.name}, not a rendered ServiceAccount`);
      }
      const names = (role?.rules ?? []).flatMap((r) => r.resourceNames ?? []);
      granted.set(subject.name, [...(granted.get(subject.name) ?? []), ...names]);
    }
  }
  for (const role of roles.values()) {
    for (const rule of role.rules) {
      const where = idOf(role);
      if (JSON.stringify(rule.apiGroups) !== '["apps"]') problem(where, `grants API groups ${rule.apiGroups}`);
      if (JSON.stringify(rule.resources) !== '["deployments/scale"]') problem(where, `grants ${rule.resources}`);
      if (rule.verbs.some((v) => !["get", "patch"].includes(v))) problem(where, `grants verbs ${rule.verbs}`);
      if (!rule.resourceNames?.length) problem(where, "grants every Deployment (no resourceNames)");
      for (const name of rule.resourceNames ?? []) {
        if (!/-(prefill|decode)$/.test(name) || !deployments.has(name)) {
          problem(where, `grants ${name}, which is not a rendered worker pool`);
        }
      }
    }
  }
  for (const [name, pod] of podsOf) {
    const account = pod.spec.serviceAccountName;
    if (account !== undefined && !accounts.has(account)) problem(`Deployment/${name}`, `runs as ${account}, not rendered`);
    if (account === undefined && pod.spec.automountServiceAccountToken !== false &&
        pod.metadata.labels["app.kubernetes.io/component"] === "planner") {
      problem(`Deployment/${name}`, "mounts the default ServiceAccount's token it does not need");
    }
    for (const c of pod.spec.containers) {
      if (c.command?.[0] !== "tandem-planner") continue;
      const where = `Deployment/${name} planner`;
      const scaled = (argValue(c.args, "kube_deployments") ?? "").split(",").filter(Boolean).map((kv) => kv.split("=")[1]);
      const allowed = granted.get(account) ?? [];
      if (canonical([...scaled].sort()) !== canonical([...allowed].sort())) {
        problem(where, `--kube_deployments scales [${scaled}] but its ServiceAccount may scale [${allowed}]`);
      }
      if ((argValue(c.args, "mode") === "apply") !== scaled.length > 0) {
        problem(where, "--mode=apply and --kube_deployments go together");
      }
      const [host, port] = (argValue(c.args, "router_metrics") ?? "").split(":");
      const svc = byKind("Service").find((s) => host.startsWith(`${s.metadata.name}.`));
      if (!svc || svc.spec.clusterIP !== "None" || svc.spec.selector?.["app.kubernetes.io/component"] !== "router" ||
          !svc.spec.ports.some((p) => String(p.port) === port)) {
        problem(where, `--router_metrics=${host}:${port} is not a headless Service of the routers with that port`);
      }
    }
  }
}

// With NetworkPolicies rendered: who reaches which port, worked out as a
// cluster applies ingress policies (a pod no policy selects takes
// anything; else some rule of a policy selecting it must admit the source
// and the port). Only the router reaches the workers' gRPC ports; only
// workers reach the workers' KV ports (their UCX_TCP_PORT_RANGE); anyone
// reaches the router.
function checkNetworkPolicies(objects) {
  const policies = objects.filter((o) => o.kind === "NetworkPolicy");
  if (policies.length === 0) return;
  const namespace = "release-namespace";
  const pods = objects
    .filter((o) => o.kind === "Deployment")
    .map((d) => {
      const c = d.spec.template.spec.containers[0];
      const range = c.env?.find((e) => e.name === "UCX_TCP_PORT_RANGE")?.value;
      return {
        labels: d.spec.template.metadata.labels,
        component: d.spec.template.metadata.labels["app.kubernetes.io/component"],
        ports: Object.fromEntries((c.ports ?? []).map((p) => [p.name, p.containerPort])),
        kv: range ? Number(range.split("-")[0]) : undefined,
        namespace,
      };
    });
  const outsider = { labels: { app: "other" }, component: "outsider", namespace };
  const elsewhere = { labels: {}, component: "another namespace", namespace: "elsewhere" };
  const peerAdmits = (peer, src) => {
    if (peer.ipBlock) return false;
    if (peer.namespaceSelector) {
      const nsLabels = { "kubernetes.io/metadata.name": src.namespace };
      if (!matchesSelector(peer.namespaceSelector, nsLabels)) return false;
    } else if (src.namespace !== namespace) {
      return false;
    }
    return !peer.podSelector || matchesSelector(peer.podSelector, src.labels);
  };
  const portAdmits = (p, port) =>
    p.port === undefined || (p.endPort === undefined ? p.port === port : p.port <= port && port <= p.endPort);
  const reaches = (src, dst, port) => {
    const selecting = policies.filter((n) => matchesSelector(n.spec.podSelector, dst.labels));
    if (selecting.length === 0) return true;
    return selecting.some((n) =>
      (n.spec.ingress ?? []).some(
        (rule) =>
          (!rule.from || rule.from.some((peer) => peerAdmits(peer, src))) &&
          (!rule.ports || rule.ports.some((p) => portAdmits(p, port))),
      ),
    );
  };
  const sources = [...pods, outsider, elsewhere];
  for (const dst of pods) {
    const worker = dst.component !== "router";
    for (const src of sources) {
      const expectations = worker
        ? [
            ["gRPC", dst.ports.grpc, src.component === "router"],
            ["KV", dst.kv, src.component === "prefill" || src.component === "decode"],
          ]
        : [["gRPC", dst.ports.grpc, true]];
      // The planner reads every router's metrics.
      if (!worker && src.component === "planner") expectations.push(["metrics", dst.ports.metrics, true]);
      for (const [what, port, allowed] of expectations) {
        if (port === undefined) continue;
        if (reaches(src, dst, port) !== allowed) {
          const verb = allowed ? "cannot" : "can";
          problem("NetworkPolicy", `${src.component} ${verb} reach ${dst.component}'s ${what} port ${port}`);
        }
      }
    }
  }
}

// EXPECT.json: [{kind, name, path: "spec.x.0.y" (or a list of keys),
// equals | includes | absent}]
// ("includes": the array at path contains the value; "count" with kind
// alone: how many objects of that kind).
const canonical = (v) =>
  JSON.stringify(v, (_, x) =>
    x && typeof x === "object" && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort()) : x,
  );

function checkExpectations(objects, expectations) {
  for (const e of expectations) {
    if (e.count !== undefined) {
      const n = objects.filter((o) => o.kind === e.kind).length;
      if (n !== e.count) problem(`expect ${e.kind}`, `${n} rendered, ${e.count} expected`);
      continue;
    }
    const where = `expect ${e.kind}/${e.name} ${e.path}`;
    const o = objects.find((x) => x.kind === e.kind && x.metadata.name === e.name);
    if (!o) {
      problem(where, "no such object");
      continue;
    }
    const keys = Array.isArray(e.path) ? e.path : e.path.split(".");
    const value = keys.reduce((v, k) => (v === undefined ? v : v[k]), o);
    if ("absent" in e) {
      if (value !== undefined) problem(where, `is ${JSON.stringify(value)}, expected absent`);
    } else if ("includes" in e) {
      if (!Array.isArray(value) || !value.some((v) => canonical(v) === canonical(e.includes))) {
        problem(where, `${JSON.stringify(value)} lacks ${JSON.stringify(e.includes)}`);
      }
    } else if (canonical(value) !== canonical(e.equals)) {
      problem(where, `is ${JSON.stringify(value)}, expected ${JSON.stringify(e.equals)}`);
    }
  }
}

// --- Flags ---------------------------------------------------------------

// The flag names a --helpfull lists ("    --name (help...); default: ...").
function helpFlags(text) {
  const names = new Set();
  for (const m of text.matchAll(/^ {4}--([a-z][a-z0-9_]*) \(/gm)) names.add(m[1]);
  return names;
}

// Each container's arguments: every --flag one its binary's --helpfull
// lists, and the whole command line parsed by the binary itself (absl
// parses every value before it handles --helpfull, and reports what it
// cannot parse as "ERROR: ...").
function checkFlags(objects, binDir) {
  const helps = new Map();
  let checked = 0;
  for (const o of objects.filter((x) => x.kind === "Deployment")) {
    for (const c of o.spec.template.spec.containers) {
      const binary = c.command?.[0];
      if (!binary?.startsWith("tandem-")) continue;
      const where = `${idOf(o)} ${binary}`;
      if (!helps.has(binary)) {
        const run = spawnSync(resolve(binDir, binary), ["--helpfull"], { encoding: "utf8" });
        const flags = helpFlags(`${run.stdout ?? ""}${run.stderr ?? ""}`);
        if (flags.size < 5) problem(where, `${binDir}/${binary} --helpfull lists ${flags.size} flags`);
        helps.set(binary, flags);
      }
      const flags = helps.get(binary);
      for (const arg of c.args ?? []) {
        const m = /^--([a-z][a-z0-9_]*)(=|$)/.exec(arg);
        if (!m) {
          problem(where, `'${arg}' is not a --flag=value argument`);
          continue;
        }
        const name = m[1];
        const known = flags.has(name) || (m[2] === "" && name.startsWith("no") && flags.has(name.slice(2)));
        if (!known) problem(where, `--${name} is not a flag of ${binary}`);
        checked++;
      }
      const run = spawnSync(resolve(binDir, binary), [...(c.args ?? []), "--helpfull"], { encoding: "utf8" });
      for (const line of `${run.stdout ?? ""}${run.stderr ?? ""}`.split("\n")) {
        if (line.startsWith("ERROR:")) problem(where, `${binary} refuses its arguments: ${line}`);
      }
    }
  }
  if (checked === 0) problem("flags", "no tandem container arguments found");
  return checked;
}

// --- Values schema ---------------------------------------------------------

function checkValues(nodeModules, schemaPath, valuesPath) {
  const require = createRequire(`${resolve(nodeModules)}/`);
  const Ajv = require("ajv").default;
  const ajv = new Ajv({ allErrors: true, strict: true, strictTypes: false });
  const validate = ajv.compile(readJson(schemaPath));
  if (validate(readJson(valuesPath))) {
    console.log(`${valuesPath}: conforms to the schema`);
    return 0;
  }
  for (const e of validate.errors) {
    console.log(`${valuesPath}: ${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`);
  }
  return 3;
}

// --- Main ----------------------------------------------------------------

const [mode, ...args] = process.argv.slice(2);
if (mode === "values") {
  process.exit(checkValues(...args));
}
let summary;
if (mode === "manifests") {
  const [nodeModules, objectsPath, expectPath] = args;
  const require = createRequire(`${resolve(nodeModules)}/`);
  const manifests = readJson(objectsPath);
  for (const { source, object } of manifests) checkSchema(require, object, `${source} ${idOf(object)}`);
  const objects = manifests.map((m) => m.object);
  checkSemantics(objects);
  checkNetworkPolicies(objects);
  if (expectPath) checkExpectations(objects, readJson(expectPath));
  summary = `${objects.length} objects valid`;
} else if (mode === "flags") {
  const [objectsPath, binDir] = args;
  const n = checkFlags(readJson(objectsPath).map((m) => m.object), binDir);
  summary = `${n} arguments are flags of their binaries, and the binaries parse them`;
} else {
  console.error("usage: check.mjs manifests|flags|values ...");
  process.exit(2);
}
for (const p of problems) console.log(`FAIL ${p}`);
if (problems.length > 0) process.exit(1);
console.log(summary);
