#!/usr/bin/env python3
"""What chunked prefill (--prefill-chunk) costs and buys on `tandem serve` (docs/benchmarks.md).

  scripts/bench_prefill_chunk.py [--tandem build/tandem] [--model M] [--chunks 16,32,64,100000]
                                 [--prompt-tokens 1000] [--reps 3]

For each chunk, one server (-t 2, everything on this machine's cores). A device steps its native
session one token at a time, in a loop, while another client sends a `--prompt-tokens` prompt to
/v1/completions (max_tokens 1): the prompt's time to answer (its TTFT) and the device's step
latencies during it (median and p99). Also the prompt alone on an idle server. Medians of
--reps runs.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from netutil import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post(port, path, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read() or b"{}")
    c.close()
    return r.status, data


def start(tandem, model, chunk):
    port = free_port()
    p = subprocess.Popen([tandem, "serve", "-m", model, "--port", str(port), "-t", "2",
                          "--prefill-chunk", str(int(chunk))], stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not start")


def run_once(port, prompt, with_device):
    stop = threading.Event()
    lat = []

    def device():
        _, d = post(port, "/tandem/v1/sessions", {})
        sid = d["session"]
        _, d = post(port, f"/tandem/v1/sessions/{sid}/step",
                    {"expected_pos": 0, "append": [2, 818, 5279], "generate": {"n": 1}})
        pos = d["pos"]
        while not stop.is_set():
            t0 = time.monotonic()
            _, d = post(port, f"/tandem/v1/sessions/{sid}/step",
                        {"expected_pos": pos, "generate": {"n": 1}})
            lat.append(time.monotonic() - t0)
            pos = d["pos"]
            if pos > 900:  # stay inside the context: cut the history back to the prompt
                _, d = post(port, f"/tandem/v1/sessions/{sid}/step",
                            {"expected_pos": 3, "rewind_to": 3})
                pos = d["pos"]

    t = threading.Thread(target=device, daemon=True)
    if with_device:
        t.start()
        time.sleep(1.0)
    n_before = len(lat)
    t0 = time.monotonic()
    status, _ = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
    ttft = time.monotonic() - t0
    during = lat[n_before:]
    stop.set()
    if with_device:
        t.join(10)
    assert status == 200
    return ttft, during


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default=os.environ.get("TANDEM_MODEL") or os.path.expanduser(
        "~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--chunks", default="16,32,64,100000")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print("| --prefill-chunk | prompt alone: TTFT s | prompt while a device steps: TTFT s "
          "| device step during it: median ms | p99 ms |")
    print("|---|---|---|---|---|")
    for s in args.chunks.split(","):
        p, port = start(args.tandem, args.model, float(s))
        try:
            alone, busy, med, p99 = [], [], [], []
            for r in range(args.reps):
                # A different prompt each time, so no cached prefix is reused.
                prompt = [2] + [1000 + (i * 7 + r * 131 + int(float(s))) % 20000
                                for i in range(args.prompt_tokens - 1)]
                alone.append(run_once(port, prompt, False)[0])
                time.sleep(1.2)
                prompt = [2] + [3000 + (i * 11 + r * 71 + int(float(s))) % 20000
                                for i in range(args.prompt_tokens - 1)]
                ttft, during = run_once(port, prompt, True)
                busy.append(ttft)
                during.sort()
                med.append(statistics.median(during) * 1000)
                p99.append(during[max(0, -(-99 * len(during) // 100) - 1)] * 1000)
            print(f"| {s} | {statistics.median(alone):.2f} ({min(alone):.2f}–{max(alone):.2f}) "
                  f"| {statistics.median(busy):.2f} ({min(busy):.2f}–{max(busy):.2f}) "
                  f"| {statistics.median(med):.1f} | {statistics.median(p99):.1f} |", flush=True)
        finally:
            p.terminate()
            p.wait(30)


if __name__ == "__main__":
    sys.exit(main())
