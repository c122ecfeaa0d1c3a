#!/usr/bin/env python3
"""Markdown tables from the results folder of scripts/bench-lanes.sh.

  lanes_report.py OUT RATE_MBIT LINK_MBIT

The physical limit of N flows is min(N x RATE, LINK) of line rate; TCP moves
about 95% of that as payload (1448 of every 1514 bytes on the wire), so each
table also gives the share of what plain TCP streams reached.
"""
import glob
import json
import os
import re
import sys


def load_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def limit(n, rate, link):
    return min(n * rate, link)


def main(out, rate, link):
    print(f"Per-flow cap {rate:g} Mbit/s, link cap {link:g} Mbit/s; "
          f"limits are line rate, figures are payload.\n")
    tcp = {}  # (rtt, streams) -> Mbit/s
    for path in sorted(glob.glob(os.path.join(out, "tcp-*.jsonl"))):
        for row in load_lines(path):
            tcp[(row["rtt"] if row["shaped"] else "unshaped", row["tcp"]["streams"])] = row["tcp"]
    if tcp:
        print("Plain TCP streams (scripts/lanes_tcp.py), payload Mbit/s:\n")
        print("| RTT | streams | Mbit/s | per stream | measured RTT (ms) | limit | % of limit |")
        print("|---|---|---|---|---|---|---|")
        for (rtt, n), row in sorted(tcp.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            if rtt == "unshaped":
                print(f"| none, no cap | {n} | {row['mbps']:.0f} | "
                      f"{min(row['per_stream_mbps']):.0f}-{max(row['per_stream_mbps']):.0f} | "
                      f"{row['srtt_ms']} | - | - |")
                continue
            lim = limit(n, rate, link)
            print(f"| {rtt} ms | {n} | {row['mbps']:.0f} | "
                  f"{min(row['per_stream_mbps']):.0f}-{max(row['per_stream_mbps']):.0f} | "
                  f"{row['srtt_ms']} | {lim:g} | {100 * row['mbps'] / lim:.0f}% |")
        print()

    kv = []
    for path in sorted(glob.glob(os.path.join(out, "kv-*.json"))):
        name = os.path.basename(path)[:-len(".json")]
        m = re.match(r"kv-rtt(\d+)-", name)
        rtt = int(m.group(1)) if m else None
        for doc in load_lines(path):
            for r in doc["results"]:
                kv.append((rtt, doc["layers"], r))
    if kv:
        print("tandem-kvbench, UCX_TLS=tcp, one transfer in flight "
              "(transfer = layers x size, one message a layer, striped over the lanes):\n")
        print("| RTT | transfer | lanes | Mbit/s | transfer p50 (ms) | limit (Mbit/s) "
              "| % of limit | % of link | % of TCP, same flows |")
        print("|---|---|---|---|---|---|---|---|---|")
        for rtt, layers, r in sorted(kv, key=lambda t: (t[0] is not None, t[0] or 0,
                                                         t[2]["size"], t[2]["lanes"])):
            mbps = r["gbps"] * 8e3
            size = r["size"] >> 20
            what = f"{layers} x {size} MiB"
            n = r["lanes"]
            if rtt is None:
                print(f"| none, no cap | {what} | {n} | {mbps:.0f} | {r['p50_us'] / 1e3:.0f} "
                      f"| - | - | - | - |")
                continue
            lim = limit(n, rate, link)
            base = tcp.get((rtt, n))
            vs_tcp = f"{100 * mbps / base['mbps']:.0f}%" if base else "-"
            print(f"| {rtt} ms | {what} | {n} | {mbps:.0f} | {r['p50_us'] / 1e3:.0f} "
                  f"| {lim:g} | {100 * mbps / lim:.0f}% | {100 * mbps / link:.0f}% | {vs_tcp} |")
        print()

    clusters = []
    for path in glob.glob(os.path.join(out, "cluster-rtt*-lanes*")):
        m = re.search(r"cluster-rtt(\d+)-lanes(\d+)$", path)
        clusters.append((int(m.group(1)), int(m.group(2)), path))
    if clusters:
        print("Cluster TTFT (router + prefill worker | decode worker across the path), "
              "one request at a time:\n")
        print("| RTT, caps | kv_lanes | completed | via prefill worker | prompt tokens | TTFT p50 (ms) "
              "| TTFT p99 (ms) | KV / request |")
        print("|---|---|---|---|---|---|---|---|")
        for rtt, lanes, path in sorted(clusters):
            where = f"{rtt} ms, capped" if rtt else "none, no cap"
            bench_json = os.path.join(path, "bench.json")
            if not os.path.exists(bench_json):
                print(f"| {where} | {lanes} | (no result) | | | | | |")
                continue
            with open(bench_json) as f:
                bench = json.load(f)
            ttft = bench["ttft_ms"]
            done = bench["completed"]
            tokens = bench["total_input_tokens"] / max(1, done)
            # The router's request log: KV bytes shipped, and whether the
            # prompt really went through the prefill worker (a failed
            # prefill falls back to computing on the decode worker).
            records = load_lines(os.path.join(path, "requests.jsonl"))
            remote = [r for r in records if r.get("disaggregated")]
            kv_bytes = "-"
            if remote:
                kv_bytes = f"{sum(r['kv_bytes'] for r in remote) / len(remote) / 2**20:.1f} MiB"
            print(f"| {where} | {lanes} | {done} of {bench['num_requests']} | {len(remote)} | {tokens:.0f} "
                  f"| {ttft['median']:.0f} | {ttft['p99']:.0f} | {kv_bytes} |")
        print()

    load = os.path.join(out, "load.txt")
    if os.path.exists(load):
        with open(load) as f:
            first = [float(line.split()[1]) for line in f if line.strip()]
        print(f"Load average (1 min) as the measurements started: "
              f"{min(first):.1f} to {max(first):.1f} on {os.cpu_count()} cores.\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
