#!/usr/bin/env python3
"""Step latency of `tandem serve` builds, alternated in one run (docs/benchmarks.md).

  scripts/bench_step_latency.py BINARY [BINARY ...] [--model M] [--steps 1000] [--rounds 4]

For each round and each binary in turn: a server pinned to core 1 with one engine thread, a
client pinned to core 0 (this process) that opens one native session and takes --steps steps,
each appending the token the last step generated and generating one (what a route event costs).
Prints one line per run: the binary, the step latency p50 and p95 in ms.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import time

from netutil import free_port


class Conn:
    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def request(self, method, path, body=None):
        self.c.request(method, path, json.dumps(body) if body is not None else None,
                       {"Content-Type": "application/json"})
        r = self.c.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else {}


def run(binary, model, steps):
    port = free_port()
    server = subprocess.Popen(["taskset", "-c", "1", binary, "serve", "-m", model, "--port",
                               str(port), "-t", "1"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if Conn(port).request("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        c = Conn(port)
        sid = c.request("POST", "/tandem/v1/sessions", {})[1]["session"]
        _, d = c.request("POST", f"/tandem/v1/sessions/{sid}/step",
                         {"expected_pos": 0, "append": [2, 818, 5279], "generate": {"n": 1}})
        lat = []
        for _ in range(steps):
            if d["pos"] > 3000:  # stay inside the context: back to the prompt
                _, d = c.request("POST", f"/tandem/v1/sessions/{sid}/step",
                                 {"expected_pos": 3, "rewind_to": 3})
                d["tokens"] = [5279]
            t0 = time.perf_counter()
            _, d = c.request("POST", f"/tandem/v1/sessions/{sid}/step",
                             {"expected_pos": d["pos"], "append": [d["tokens"][-1]],
                              "generate": {"n": 1}})
            lat.append((time.perf_counter() - t0) * 1000)
        lat.sort()
        return lat[len(lat) // 2], lat[int(0.95 * (len(lat) - 1))]
    finally:
        server.terminate()
        server.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--model", default=os.environ.get("TANDEM_MODEL") or os.path.expanduser(
        "~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    for r in range(args.rounds):
        for b in args.binaries:
            p50, p95 = run(b, args.model, args.steps)
            print(f"round {r + 1} {b}: p50 {p50:.2f} ms, p95 {p95:.2f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())
