"""Fakes for planner_kube_test.sh: two router replicas' /metrics, each
counting requests at a steady rate, and the
Kubernetes API's scale subresource of two Deployments, which records every
PATCH. Usage: planner_kube_fake.py PORT_FILE STATE_FILE. Writes the three
ports to PORT_FILE ("router_a router_b api") and, after every PATCH, the
Deployments' replicas and the requests seen to STATE_FILE as JSON."""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

START = time.monotonic()
lock = threading.Lock()
replicas = {"tandem-prefill": 1, "tandem-decode": 1}
patches = []
bad_requests = []

def router_text(rate, ready_decode):
    # requests grow at `rate` per second (counters may hold fractions);
    # every TTFT under 0.1 s.
    n = f"{rate * (time.monotonic() - START):.6f}"
    return (
        '# TYPE tandem_router_requests_total counter\n'
        f'tandem_router_requests_total{{outcome="ok"}} {n}\n'
        f'tandem_router_time_to_first_token_seconds_bucket{{le="0.1"}} {n}\n'
        f'tandem_router_time_to_first_token_seconds_bucket{{le="+Inf"}} {n}\n'
        'tandem_router_workers_ready{pool="prefill"} 1\n'
        f'tandem_router_workers_ready{{pool="decode"}} {ready_decode}\n')


def make_router(rate, ready_decode):
    class Router(BaseHTTPRequestHandler):
        def do_GET(self):
            body = router_text(rate, ready_decode).encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    return Router


PREFIX = "/apis/apps/v1/namespaces/serving/deployments/"


def save():
    """Writes the API's state for the test (called with `lock` held)."""
    with open(sys.argv[2] + ".tmp", "w") as f:
        json.dump({"replicas": replicas, "patches": patches, "bad": bad_requests}, f)
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])


class Api(BaseHTTPRequestHandler):
    def name(self):
        if not self.path.startswith(PREFIX) or not self.path.endswith("/scale"):
            return None
        name = self.path[len(PREFIX):-len("/scale")]
        return name if name in replicas else None

    def answer(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def scale(self, name):
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": name, "namespace": "serving"},
                "spec": {"replicas": replicas[name]}, "status": {"replicas": replicas[name]}}

    def do_GET(self):
        with lock:
            name = self.name()
            if name is None:
                bad_requests.append("GET " + self.path)
                save()
                return self.answer(404, {"kind": "Status", "message": "not found"})
            self.answer(200, self.scale(name))

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            name = self.name()
            kind = self.headers.get("Content-Type")
            if name is None or kind != "application/merge-patch+json":
                bad_requests.append(f"PATCH {self.path} {kind}")
                save()
                return self.answer(404 if name is None else 415, {"kind": "Status"})
            replicas[name] = json.loads(body)["spec"]["replicas"]
            patches.append({name: replicas[name]})
            save()
            self.answer(200, self.scale(name))

    def log_message(self, *args):
        pass


servers = [ThreadingHTTPServer(("127.0.0.1", 0), make_router(4.0, 1)),
           ThreadingHTTPServer(("127.0.0.1", 0), make_router(5.0, 3)),
           ThreadingHTTPServer(("127.0.0.1", 0), Api)]
for s in servers:
    threading.Thread(target=s.serve_forever, daemon=True).start()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(" ".join(str(s.server_address[1]) for s in servers) + "\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
threading.Event().wait()
