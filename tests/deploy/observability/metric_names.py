#!/usr/bin/env python3
"""The Prometheus metric names tandem's binaries register, read from the C++
source, and the names that the chart's dashboard, its alert rules and
docs/operations.md use.

  metric_names.py source [--root DIR]
      the registered metrics as JSON: [{name, type, help, file}], sorted
  metric_names.py used FILE...
      the tandem_* names FILE... mention, one a line (raw text: a rendered
      manifest, a template, the dashboard's JSON or a Markdown page)
  metric_names.py check-used NAMES.json FILE...
      every name FILE... mention is a registered metric (NAMES.json is the
      output of `source`, or of a scrape in the same form); exit 1 naming
      those that are not

Registrations it knows, which are the only ones the tree has:
  AddCounter / AddGauge / AddHistogram (common/metrics/metrics.h) with a
  literal name; prometheus::BuildCounter() / BuildGauge() / BuildHistogram()
  with .Name("literal"); a metrics::OutcomeCounter member constructed with a
  literal name; and the classes of common/metrics that register
  `prefix + "_suffix"` (EngineGauges, TierMetrics), expanded for every
  member of that class constructed with a literal prefix. A registration in
  another form is not seen: the cluster test (cluster_metrics_test.sh)
  compares this list with what the processes serve, so such a miss fails
  there.

  metric_names.py check-cluster SOURCE.json --scrapes FILE... --uses FILE...
                  --docs OPERATIONS.md
      what a running cluster served (SCRAPES: /metrics bodies) against the
      source (SOURCE.json, from `source`): the same names with the same
      types, less NOT_ON_A_LOCAL_CLUSTER below; every name the USES files
      mention among those served; and OPERATIONS.md's metrics reference
      (its table rows `| `name` | type | labels | meaning |`) listing every
      served metric once, with its type and its label names

A use is a name matching tandem_[a-z0-9_]+ not inside a longer word; a
histogram's series (_bucket, _sum, _count) count as the histogram.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Where the binaries' metrics are registered (tests and tools left out).
SOURCE_DIRS = ("router", "prefill_worker", "decode_worker", "planner", "common", "kvtransfer")
TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}
STRING = r'"(?:[^"\\]|\\.)*"'
HELP = rf"((?:\s*{STRING})+)"

ADD = re.compile(rf'\bAdd(Counter|Gauge|Histogram)\(\s*\w+\s*,\s*"(tandem_[a-z0-9_]+)"\s*,{HELP}')
BUILD = re.compile(
    rf'\bBuild(Counter|Gauge|Histogram)\(\)\s*\.Name\(\s*"(tandem_[a-z0-9_]+)"\s*\)\s*\.Help\({HELP}')
# member_(registry, "tandem_...", "help"): a class constructed with a name.
MEMBER_NAMED = re.compile(rf'\b(\w+)\(\s*\w+\s*,\s*"(tandem_[a-z0-9_]+)"\s*,{HELP}')
# member_(registry, "tandem_prefill"): a class constructed with a prefix.
MEMBER_PREFIX = re.compile(r'\b(\w+)\(\s*\w+\s*,\s*"(tandem_[a-z0-9_]+)"\s*\)')
PREFIX_ADD = re.compile(rf'\bAdd(Counter|Gauge|Histogram)\(\s*\w+\s*,\s*prefix \+ "(_[a-z0-9_]+)"\s*,{HELP}')
PREFIX_BUILD = re.compile(
    rf'\bBuild(Counter|Gauge|Histogram)\(\)\s*\.Name\(\s*prefix \+ "(_[a-z0-9_]+)"\s*\)\s*\.Help\({HELP}')
CONSTRUCTOR = re.compile(r"^(\w+)::\1\(", re.M)
USE = re.compile(r"(?<![A-Za-z0-9_])tandem_[a-z0-9_]+")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def help_text(literals):
    parts = re.findall(STRING, literals)
    return "".join(json.loads(p) for p in parts)


def sources(root):
    for base in SOURCE_DIRS:
        for path in sorted((root / base).rglob("*")):
            if path.suffix in (".cc", ".h") and not path.name.endswith("_test.cc"):
                yield path


def member_types(root):
    """Member or field name -> its declared type's last name component."""
    declared = {}
    decl = re.compile(r"^\s*(?:const\s+)?(?:\w+::)*(\w+)\s*&?\s+(\w+)\s*;", re.M)
    for path in sources(root):
        if path.suffix == ".h":
            for m in decl.finditer(path.read_text()):
                declared.setdefault(m.group(2), set()).add(m.group(1))
    return declared


def prefix_classes(root):
    """Class -> [(suffix, type, help)] of the classes registering prefix + suffix."""
    out = {}
    for path in sources(root):
        text = path.read_text()
        ctors = [(m.start(), m.group(1)) for m in CONSTRUCTOR.finditer(text)]
        for regex in (PREFIX_ADD, PREFIX_BUILD):
            for m in regex.finditer(text):
                owner = [name for start, name in ctors if start < m.start()]
                if not owner:
                    continue
                out.setdefault(owner[-1], []).append((m.group(2), TYPES[m.group(1)], help_text(m.group(3))))
    return out


def registered(root=ROOT):
    metrics = {}

    def add(name, kind, help, path):
        rel = str(path.relative_to(root))
        old = metrics.get(name)
        if old and old["type"] != kind:
            raise SystemExit(f"{name}: registered as {old['type']} in {old['file']} and {kind} in {rel}")
        metrics.setdefault(name, {"name": name, "type": kind, "help": help, "file": rel})

    types = member_types(root)
    classes = prefix_classes(root)
    for path in sources(root):
        text = path.read_text()
        for regex in (ADD, BUILD):
            for m in regex.finditer(text):
                add(m.group(2), TYPES[m.group(1)], help_text(m.group(3)), path)
        for m in MEMBER_NAMED.finditer(text):
            if "OutcomeCounter" in types.get(m.group(1), ()):
                add(m.group(2), "counter", help_text(m.group(3)), path)
        for m in MEMBER_PREFIX.finditer(text):
            for cls in types.get(m.group(1), ()):
                for suffix, kind, help in classes.get(cls, []):
                    add(m.group(2) + suffix, kind, help, path)
    return sorted(metrics.values(), key=lambda x: x["name"])


def used(paths):
    names = set()
    for path in paths:
        names.update(USE.findall(Path(path).read_text()))
    return names


def unknown(names, known):
    """The names that are no metric of `known` ({name: type}), histogram series mapped."""
    bad = set()
    for name in names:
        if name in known:
            continue
        base = next((name[: -len(s)] for s in HISTOGRAM_SERIES if name.endswith(s)), None)
        if base is None or known.get(base) != "histogram":
            bad.add(name)
    return bad


# Metrics a small local cluster on the CPU cannot serve, each with why;
# check-cluster requires them registered in the source instead (and not
# served, so that an entry does not outlive its reason). The cluster test
# starts what the others need: a planner, a KV tier, a mixture of experts.
NOT_ON_A_LOCAL_CLUSTER = {}

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s")
TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)")
DOC_ROW = re.compile(r"^\| `(tandem_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|")


def scraped(paths):
    """{name: {"type", "labels": set}} of the families with samples."""
    families, seen = {}, {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if m := TYPE_LINE.match(line):
                families.setdefault(m.group(1), {"type": m.group(2), "labels": set()})
            elif (m := SAMPLE.match(line)) and not line.startswith("#"):
                name = m.group(1)
                base = next((name[: -len(x)] for x in HISTOGRAM_SERIES
                             if name.endswith(x) and families.get(name[: -len(x)], {}).get("type") == "histogram"),
                            name)
                labels = set(re.findall(r'([a-zA-Z_]\w*)="', m.group(3) or "")) - {"le"}
                seen.setdefault(base, set()).update(labels)
    return {n: {"type": families.get(n, {}).get("type"), "labels": l} for n, l in seen.items() if n.startswith("tandem_")}


def doc_rows(path):
    rows = {}
    for line in Path(path).read_text().splitlines():
        if m := DOC_ROW.match(line):
            labels = set(re.findall(r"`([a-z_]+)`", m.group(3)))
            rows.setdefault(m.group(1), []).append({"type": m.group(2), "labels": labels})
    return rows


def check_cluster(source_path, scrapes, uses, docs):
    source = {m["name"]: m["type"] for m in json.load(open(source_path))}
    served = scraped(scrapes)
    fails = []
    for name, kind in sorted(source.items()):
        if name in NOT_ON_A_LOCAL_CLUSTER:
            if name in served:
                fails.append(f"{name} is served: take it off NOT_ON_A_LOCAL_CLUSTER")
        elif name not in served:
            fails.append(f"{name} is registered in the source but no process served it")
        elif served[name]["type"] != kind:
            fails.append(f"{name} is served as a {served[name]['type']}, registered as a {kind}")
    for name in NOT_ON_A_LOCAL_CLUSTER:
        if name not in source:
            fails.append(f"{name} of NOT_ON_A_LOCAL_CLUSTER is not registered in the source")
    for name in sorted(set(served) - set(source)):
        fails.append(f"{name} is served but metric_names.py did not find it in the source")
    known = {n: v["type"] for n, v in served.items()}
    known.update({n: source[n] for n in NOT_ON_A_LOCAL_CLUSTER if n in source})
    for path in uses:
        for name in sorted(unknown(used([path]), known)):
            fails.append(f"{path} uses {name}, which no process served")
    rows = doc_rows(docs)
    for name, v in sorted(served.items()):
        got = rows.get(name, [])
        if len(got) != 1:
            fails.append(f"{docs}: {len(got)} rows for {name} in the metrics reference, 1 expected")
        elif got[0]["type"] != v["type"] or got[0]["labels"] != v["labels"]:
            fails.append(f"{docs}: {name} is a {got[0]['type']} with labels {sorted(got[0]['labels'])}; "
                         f"served as a {v['type']} with labels {sorted(v['labels'])}")
    for name in sorted(set(rows) - set(served) - set(NOT_ON_A_LOCAL_CLUSTER)):
        fails.append(f"{docs}: the metrics reference lists {name}, which no process served")
    for f in fails:
        print(f"FAIL {f}")
    if not fails:
        print(f"{len(served)} metrics served, as the source registers them ({len(NOT_ON_A_LOCAL_CLUSTER)} "
              f"allowed absent); the uses of {len(uses)} files and {len(rows)} reference rows agree")
    return 1 if fails else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("source")
    s.add_argument("--root", type=Path, default=ROOT)
    u = sub.add_parser("used")
    u.add_argument("files", nargs="+")
    c = sub.add_parser("check-used")
    c.add_argument("names")
    c.add_argument("files", nargs="+")
    k = sub.add_parser("check-cluster")
    k.add_argument("source")
    k.add_argument("--scrapes", nargs="+", required=True)
    k.add_argument("--uses", nargs="+", required=True)
    k.add_argument("--docs", required=True)
    args = parser.parse_args()
    if args.mode == "check-cluster":
        sys.exit(check_cluster(args.source, args.scrapes, args.uses, args.docs))
    if args.mode == "source":
        found = registered(args.root)
        if not found:
            raise SystemExit(f"no metric registrations found under {args.root}")
        json.dump(found, sys.stdout, indent=1)
        print()
    elif args.mode == "used":
        print("\n".join(sorted(used(args.files))))
    else:
        known = {m["name"]: m["type"] for m in json.load(open(args.names))}
        status = 0
        for path in args.files:
            bad = sorted(unknown(used([path]), known))
            if bad:
                status = 1
                print(f"FAIL {path}: not metrics the binaries register: {', '.join(bad)}")
            else:
                print(f"{path}: {len(used([path]))} metric names, each registered")
        sys.exit(status)


if __name__ == "__main__":
    main()
