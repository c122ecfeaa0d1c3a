#!/usr/bin/env python3
"""A picture of a few panels of the chart's Grafana dashboard, for
docs/operations.md (no Grafana needed).

  dashboard_svg.py record --prometheus URL --start T --end T --out RUN.json
      runs the queries of PANELS, as deploy/helm/tandem/dashboards/tandem.json
      has them ($namespace matching anything, $__rate_interval = --rate),
      over [start, end] (unix seconds) against a Prometheus's query_range
      API, and keeps the results
  dashboard_svg.py render RUN.json --out dashboard.svg [--ttft_slo S] [--tpot_slo S]
      draws them: one chart per panel, each series a line (those at 0 all
      along left out), the SLOs as dashed lines on the TTFT and TPOT panels
      as the chart draws them

record_dashboard.sh makes such a run on a local cluster. The SVG is
written by hand here: the bench report's chart writer (tools/bench) is C++
inside tandem-bench and draws its own results only.
"""

import argparse
import json
import math
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from xml.sax.saxutils import escape

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy/helm/tandem/dashboards/tandem.json"
PANELS = ["Router requests by outcome", "Time to first token", "Time per output token",
          "KV transfer bytes", "KV transfer latency", "Prefix cache hit rate"]
COLORS = ["#3274d9", "#e0752d", "#37872d", "#8f3bb8", "#c4162a", "#1f9aa0"]
W, H, COLS = 380, 220, 3
PAD_L, PAD_R, PAD_T, PAD_B = 52, 12, 28, 44


def record(args):
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    run = {"start": args.start, "end": args.end, "panels": []}
    for title in PANELS:
        p = panels[title]
        out = {"title": title, "unit": p["fieldConfig"]["defaults"].get("unit", ""), "series": []}
        for t in p["targets"]:
            expr = t["expr"].replace('namespace=~"$namespace"', 'namespace=~".*"')
            expr = expr.replace("$__rate_interval", args.rate)
            q = urllib.parse.urlencode({"query": expr, "start": args.start, "end": args.end, "step": args.step})
            with urllib.request.urlopen(f"{args.prometheus}/api/v1/query_range?{q}", timeout=30) as r:
                body = json.load(r)
            if body.get("status") != "success":
                sys.exit(f"{title}: {expr}: {body}")
            for s in body["data"]["result"]:
                legend = t.get("legendFormat", "")
                for k, v in s["metric"].items():
                    legend = legend.replace("{{%s}}" % k, v)
                points = [(float(x) - args.start, float(y)) for x, y in s["values"] if y not in ("NaN", "+Inf", "-Inf")]
                if points:
                    out["series"].append({"name": legend or expr, "points": points})
        run["panels"].append(out)
    Path(args.out).write_text(json.dumps(run, indent=None, separators=(",", ":")) + "\n")


def nice(top):
    """A round step giving about four ticks up to top, and the axis maximum."""
    if top <= 0:
        return 1.0, 0.25
    raw = top / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if raw <= m * mag)
    return step * math.ceil(top / step - 1e-9), step


def label(v, unit):
    if unit == "percentunit":
        return f"{round(v * 100, 1):g}%"
    if unit == "s":
        return f"{round(v * 1000, 3):g} ms" if v < 1 else f"{v:g} s"
    if unit == "Bps":
        for d, u in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if v >= d:
                return f"{round(v / d, 3):g} {u}"
        return f"{v:g} B/s"
    return f"{v:g}"


def chart(panel, x0, y0, span, slo):
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    series = [s for s in panel["series"] if any(y != 0 for _, y in s["points"])]
    top = max([y for s in series for _, y in s["points"]] + [slo or 0]) * 1.1
    if panel["unit"] == "percentunit":
        top = 1.0
    ymax, ystep = nice(top)
    sx = lambda t: x0 + PAD_L + pw * t / span
    sy = lambda v: y0 + PAD_T + ph * (1 - v / ymax)
    out = [f'<rect x="{x0 + 1}" y="{y0 + 1}" width="{W - 2}" height="{H - 2}" rx="4" fill="#181b1f" stroke="#2c3235"/>',
           f'<text x="{x0 + 10}" y="{y0 + 18}" fill="#ccccdc" font-size="13" font-weight="bold">{escape(panel["title"])}</text>']
    v = 0.0
    while v <= ymax + 1e-12:
        y = sy(v)
        out.append(f'<line x1="{x0 + PAD_L}" y1="{y:.1f}" x2="{x0 + W - PAD_R}" y2="{y:.1f}" stroke="#2c3235"/>')
        out.append(f'<text x="{x0 + PAD_L - 4}" y="{y + 4:.1f}" fill="#8e8e8e" font-size="10" text-anchor="end">'
                   f'{escape(label(v, panel["unit"]))}</text>')
        v += ystep
    for m in range(0, int(span // 60) + 1):
        x = sx(m * 60)
        out.append(f'<text x="{x:.1f}" y="{y0 + PAD_T + ph + 13}" fill="#8e8e8e" font-size="10" '
                   f'text-anchor="middle">{m}m</text>')
    if slo:
        y = sy(slo)
        out.append(f'<line x1="{x0 + PAD_L}" y1="{y:.1f}" x2="{x0 + W - PAD_R}" y2="{y:.1f}" stroke="#f2495c" '
                   f'stroke-dasharray="6 4" stroke-width="1.5"/>')
        out.append(f'<text x="{x0 + W - PAD_R - 2}" y="{y - 4:.1f}" fill="#f2495c" font-size="10" '
                   f'text-anchor="end">SLO {escape(label(slo, "s"))}</text>')
    # The legend in as many rows as it takes (two fit under the axis).
    rows, row, x = [], [], x0 + PAD_L
    for i, s in enumerate(series[:6]):
        name = s["name"][:22]
        width = 24 + 6 * len(name)
        if row and x + width - 10 > x0 + W:
            rows.append(row)
            row, x = [], x0 + PAD_L
        row.append((i, name, x))
        x += width
    if row:
        rows.append(row)
    row_ys = [y0 + H - 12] if len(rows) == 1 else [y0 + H - 19, y0 + H - 7]
    for i, s in enumerate(series[:6]):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(t):.1f},{sy(min(y, ymax)):.1f}" for t, y in s["points"])
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    for row, ly in zip(rows, row_ys):
        for i, name, lx in row:
            color = COLORS[i % len(COLORS)]
            out.append(f'<rect x="{lx}" y="{ly - 7}" width="10" height="3" fill="{color}"/>')
            out.append(f'<text x="{lx + 14}" y="{ly}" fill="#ccccdc" font-size="10">{escape(name)}</text>')
    return out


def render(args):
    run = json.loads(Path(args.run).read_text())
    span = run["end"] - run["start"]
    rows = math.ceil(len(run["panels"]) / COLS)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * COLS}" height="{H * rows}" '
           f'viewBox="0 0 {W * COLS} {H * rows}" font-family="Helvetica, Arial, sans-serif">',
           f'<rect width="{W * COLS}" height="{H * rows}" fill="#111217"/>']
    for i, panel in enumerate(run["panels"]):
        slo = {"Time to first token": args.ttft_slo, "Time per output token": args.tpot_slo}.get(panel["title"])
        out += chart(panel, (i % COLS) * W, (i // COLS) * H, span, slo)
    out.append("</svg>")
    Path(args.out).write_text("\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("record")
    r.add_argument("--prometheus", required=True)
    r.add_argument("--start", type=float, required=True)
    r.add_argument("--end", type=float, required=True)
    r.add_argument("--step", default="5s")
    r.add_argument("--rate", default="30s")
    r.add_argument("--out", required=True)
    d = sub.add_parser("render")
    d.add_argument("run")
    d.add_argument("--out", required=True)
    d.add_argument("--ttft_slo", type=float)
    d.add_argument("--tpot_slo", type=float)
    args = parser.parse_args()
    record(args) if args.mode == "record" else render(args)


if __name__ == "__main__":
    main()
