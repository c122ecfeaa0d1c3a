#!/usr/bin/env python3
"""Streams a completion from a tandem router and prints a summary.

    python examples/stream.py --router 127.0.0.1:8100 --prompt "Once upon a time"

Ctrl-C cancels the request (the router frees its KV on every worker);
--stop-after N cancels it after N chunks, to show cancel() in code.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import tandem_client as tc


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", default="127.0.0.1:8100", help="the router's host:port")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds for the whole call (the gRPC deadline)")
    parser.add_argument("--api-key", default=None, help="for a router started with --api_key")
    parser.add_argument("--tls-ca", default=None,
                        help="PEM CA of a router started with --tls_cert (dials TLS)")
    parser.add_argument("--stop-after", type=int, default=0,
                        help="cancel after this many chunks (0 = read to the end)")
    args = parser.parse_args(argv)

    ca = None
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            ca = f.read()
    with tc.Client(args.router, api_key=args.api_key, root_certificates=ca) as client:
        start = time.monotonic()
        first: Optional[float] = None
        tokens = 0
        finished: Optional[tc.Finished] = None
        stream = client.generate(args.prompt, max_tokens=args.max_tokens,
                                 temperature=args.temperature, seed=args.seed,
                                 timeout=args.timeout)
        try:
            with stream:
                for i, chunk in enumerate(stream, 1):
                    if chunk.token_ids and first is None:
                        first = time.monotonic()
                    tokens += len(chunk.token_ids)
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                    finished = chunk.finished or finished
                    if args.stop_after and i >= args.stop_after:
                        stream.cancel()
        except KeyboardInterrupt:
            print("\n[cancelled]", file=sys.stderr)
            return 130
        except tc.DeadlineExceeded:
            print(f"\n[no answer within {args.timeout} s]", file=sys.stderr)
            return 1
        except tc.TandemError as e:
            print(f"\n[{e.code.name}: {e.message}]", file=sys.stderr)
            return 1
    print()
    ttft = f"{(first - start) * 1000:.1f} ms" if first is not None else "-"
    if finished is None:
        print(f"[cancelled after {tokens} tokens; TTFT {ttft}]", file=sys.stderr)
    else:
        print(f"[{finished.reason.name.lower()}: {finished.usage.prompt_tokens} prompt tokens, "
              f"{tokens} generated; TTFT {ttft}; decode worker {finished.decode_worker}]",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
