#!/usr/bin/env python3
"""Plain TCP streams for scripts/bench-lanes.sh: the link's capacity without UCX.

  lanes_tcp.py server PORT
  lanes_tcp.py client HOST PORT STREAMS SECONDS

The client opens STREAMS connections, sends on each from its own thread,
and after one second of ramp-up counts the bytes the receiver acknowledged
(TCP_INFO tcpi_bytes_acked) over SECONDS. It prints one JSON line: the total
and per-stream rates in Mbit/s and the smoothed RTT the kernel saw.
"""
import json
import socket
import struct
import sys
import threading
import time

# Offsets into struct tcp_info (linux/tcp.h): tcpi_rtt (us) and tcpi_bytes_acked.
RTT_OFFSET, BYTES_ACKED_OFFSET = 68, 120
RAMP_UP_S = 1.0


def serve(port):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(64)

    def drain(conn):
        while conn.recv(1 << 20):
            pass
        conn.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def tcp_info(sock):
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    rtt_us = struct.unpack_from("I", info, RTT_OFFSET)[0]
    acked = struct.unpack_from("Q", info, BYTES_ACKED_OFFSET)[0]
    return rtt_us, acked


def client(host, port, streams, seconds):
    socks = [socket.create_connection((host, port), timeout=10) for _ in range(streams)]
    done = threading.Event()
    chunk = b"k" * (1 << 20)

    def send(sock):
        while not done.is_set():
            sock.sendall(chunk)

    threads = [threading.Thread(target=send, args=(s,), daemon=True) for s in socks]
    for t in threads:
        t.start()
    time.sleep(RAMP_UP_S)
    start = [tcp_info(s)[1] for s in socks]
    t0 = time.monotonic()
    time.sleep(seconds)
    end = [tcp_info(s) for s in socks]
    elapsed = time.monotonic() - t0
    done.set()
    per_stream = [(e[1] - b) * 8 / elapsed / 1e6 for b, e in zip(start, end)]
    print(json.dumps({
        "streams": streams,
        "mbps": round(sum(per_stream), 1),
        "per_stream_mbps": [round(r, 1) for r in per_stream],
        "srtt_ms": round(sum(e[0] for e in end) / len(end) / 1000, 2),
    }), flush=True)
    for s in socks:
        s.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 6 and sys.argv[1] == "client":
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    else:
        sys.exit(__doc__)
