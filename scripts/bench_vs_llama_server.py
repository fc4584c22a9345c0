#!/usr/bin/env python3
"""`tandem serve` against llama.cpp's `llama-server`: the same GGUF file, the same core, the same
OpenAI-compatible load (docs/benchmarks.md quotes its output).

  scripts/bench_vs_llama_server.py --llama-server PATH [--model M] [--streams 1,32] [--seconds 20]
                                   [--reps 3] [--server-core 1] [--client-core 0]
                                   [--tandem-arg=ARG ...] [--json]

Each of N streams sends POST /v1/completions with its own 32-token prompt (token ids, which both
servers take), "max_tokens": 16, greedy, "stream": true, and starts the next request as soon as
one ends, for --seconds. Throughput is the generated tokens that arrived (one SSE chunk each)
inside the window, over all streams, per second: tokens of requests still running when the time
is up count for what they delivered. Rounds alternate between the servers (tandem, llama,
tandem, llama, ...); each server runs pinned to --server-core with one thread and N stateless
slots (llama-server --parallel N with 128 tokens each, continuous batching being its default;
tandem serve --parallel max(N, 8), its default 8), everything else at each server's defaults. Prints the median of --reps rounds with min..max, and the ratio of the medians.
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


def wait_health(port, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it was ready")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"no /health answer on port {port} within {timeout} s")


def start(kind, args, streams):
    port = free_port()
    pin = ["taskset", "-c", args.server_core]
    if kind == "tandem":
        cmd = pin + [args.tandem, "serve", "-m", args.model, "--host", "127.0.0.1",
                     "--port", str(port), "-t", "1", "--parallel", str(max(streams, 8))]
        cmd += args.tandem_arg
    else:
        cmd = pin + [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port",
                     str(port), "-t", "1", "-tb", "1", "--parallel", str(streams), "-c",
                     str(128 * streams), "--no-warmup"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_health(port, proc)
    return proc, port


def stream_tokens(port, prompt, deadline, counter, lock):
    body = json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True,
                       "model": "m"})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    for line in r:
        if time.time() > deadline:
            break
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        d = json.loads(line[6:])
        if d.get("choices") and d["choices"][0].get("text", "") != "":
            with lock:
                counter[0] += 1
    c.close()


def throughput(port, streams, seconds):
    counter, lock, errors = [0], threading.Lock(), []
    deadline = time.time() + seconds

    def worker(i):
        n = 0
        while time.time() < deadline:
            # A prompt of its own per stream and request: no prefix cache makes one cheaper.
            prompt = [(i * 7919 + n * 104729 + k * 31) % 100000 + 1000 for k in range(32)]
            try:
                stream_tokens(port, prompt, deadline, counter, lock)
            except Exception as e:  # counted, reported, and the round fails
                errors.append(repr(e))
                return
            n += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} stream(s) failed: {errors[0]}")
    return counter[0] / seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/tandem/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--server-core", default="1")
    ap.add_argument("--client-core", default="0")
    ap.add_argument("--tandem-arg", action="append", default=[],
                    help="one more argument for tandem serve (repeat it), e.g. --prefill-chunk 256")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.sched_setaffinity(0, {int(args.client_core)})
    rows = []
    for streams in [int(s) for s in args.streams.split(",")]:
        got = {"tandem": [], "llama": []}
        for _ in range(args.reps):
            for kind in ("tandem", "llama"):
                proc, port = start(kind, args, streams)
                try:
                    throughput(port, streams, 3)  # warm-up: pages in the weights
                    got[kind].append(throughput(port, streams, args.seconds))
                finally:
                    proc.terminate()
                    proc.wait()
                print(f"streams {streams} {kind}: {got[kind][-1]:.1f} tok/s", file=sys.stderr)
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append({"streams": streams, "tandem": got["tandem"], "llama": got["llama"],
                     "tandem_median": med["tandem"], "llama_median": med["llama"],
                     "ratio": med["tandem"] / med["llama"] if med["llama"] else None})
    if args.json:
        print(json.dumps({"model": args.model, "seconds": args.seconds, "rows": rows}, indent=1))
        return
    print("| streams | tandem serve tok/s (min..max) | llama-server tok/s (min..max) | ratio |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['streams']} | {r['tandem_median']:.1f} ({min(r['tandem']):.1f}..{max(r['tandem']):.1f})"
              f" | {r['llama_median']:.1f} ({min(r['llama']):.1f}..{max(r['llama']):.1f}) | {r['ratio']:.2f}x |")


if __name__ == "__main__":
    main()
