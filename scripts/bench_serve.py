#!/usr/bin/env python3
"""Benchmarks of `tandem serve` on 127.0.0.1 (docs/benchmarks.md quotes its output).

  scripts/bench_serve.py [--model M] [--server-cores 1] [--client-cores 0] [--threads 1]
                         [--seconds 15] [--reps 3] [--sessions 1,8,32,64] [--json]

1. Throughput: N concurrent sessions each append a 32-token prompt, then ask for 16 tokens per
   step until the time is up; generated tokens per second over all sessions (median of --reps
   runs, with min..max), and the ratio to one session. Counted by the server: the tokens its
   decode batches ran between the start and the end of the window (/metrics
   tandem_batch_tokens_sum, less the prompts of sessions renewed past 2,200 tokens: every other
   row of this load generates one token), so that the steps still running when the time is up
   count for what they did in it. The clients' own count of
   the tokens of the steps they finished in time is printed next to it: it leaves out up to a
   step per session (at 32 sessions ~7% of a 10 s window). Also generated tokens per CPU second
   of the server process over the window (its own work, robust to other load on a shared
   machine; at one session it leaves out the time the server waits for the client, so that
   ratio is the stricter one), and the mean rows per batch.
2. Step latency: one session, each step appends 1 token and generates 1 (what a route event
   costs), next to one bare engine decode step (`tandem bench -p 0 -n 128` on the same cores).
3. Bytes per step against context length: the request and answer bytes of such a step at
   contexts 64..2048, for the native protocol and, for comparison, a stateless
   /v1/completions request carrying the whole context as token ids.

The server runs pinned to --server-cores (taskset), the clients to --client-cores.
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


class Conn:
    """One keep-alive HTTP connection that counts the bytes it sends and receives."""

    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.sent = self.received = 0

    def post(self, path, body):
        data = json.dumps(body, separators=(",", ":")).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        self.c.putrequest("POST", path, skip_accept_encoding=True, skip_host=True)
        self.c.putheader("Host", "127.0.0.1")
        self.c.putheader("Content-Type", "application/json")
        self.c.putheader("Content-Length", str(len(data)))
        self.c.endheaders(data)
        self.sent += len(head) + len(data)
        r = self.c.getresponse()
        payload = r.read()
        status_line = f"HTTP/1.1 {r.status} {r.reason}\r\n"
        self.received += len(status_line) + len(str(r.headers)) + len(payload)
        return r.status, json.loads(payload)


def start_server(args, extra=()):
    port = free_port()
    cmd = ["taskset", "-c", args.server_cores, args.tandem, "serve", "-m", args.model,
           "--port", str(port), "-t", str(args.threads), "--max-sessions", "72", "-c", "2304",
           *args.server_arg, *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("server did not start")


def new_session(conn):
    status, body = conn.post("/tandem/v1/sessions", {})
    assert status == 201, body
    return body["session"]


def cpu_seconds(pid):
    """User + system CPU time of a process so far (Linux /proc), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric(port, name):
    """One unlabelled sample from the server's /metrics (Prometheus text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def throughput(port, n_sessions, seconds, pid=None):
    """Over a window of `seconds`: generated tokens per second as the server counts them (the
    rows of its decode batches), as the clients count them (finished steps), per CPU second of
    the server (pid), and the mean rows per batch."""
    prompt = [2] + [(i * 7919) % 200000 + 1000 for i in range(31)]
    counts = [0] * n_sessions
    renewed = [0] * n_sessions
    start = threading.Barrier(n_sessions + 1)
    stop_at = [0.0]
    errors = []

    def worker(i):
        conn = Conn(port)
        sid = new_session(conn)
        status, body = conn.post(f"/tandem/v1/sessions/{sid}/step",
                                 {"expected_pos": 0, "append": prompt[:-1] + [prompt[-1] + i]})
        pos = body["pos"]
        start.wait()
        while time.time() < stop_at[0]:
            if pos > 2200:
                sid = new_session(conn)
                conn.post(f"/tandem/v1/sessions/{sid}/step", {"expected_pos": 0, "append": prompt})
                pos = len(prompt)
                if time.time() <= stop_at[0]:
                    renewed[i] += len(prompt)  # batch rows that generated nothing
            status, body = conn.post(f"/tandem/v1/sessions/{sid}/step",
                                     {"expected_pos": pos, "generate": {"n": 16}})
            if status != 200:
                errors.append(body)
                return
            pos = body["pos"]
            if time.time() <= stop_at[0]:
                counts[i] += len(body["tokens"])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_sessions)]
    for t in threads:
        t.start()
    stop_at[0] = time.time() + 1e9
    start.wait()
    t0 = time.time()
    cpu0 = cpu_seconds(pid) if pid else 0.0
    rows0 = metric(port, "tandem_batch_tokens_sum")
    batches0 = metric(port, "tandem_batch_tokens_count")
    stop_at[0] = t0 + seconds
    time.sleep(max(0.0, stop_at[0] - time.time()))
    t1 = time.time()
    cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
    rows = metric(port, "tandem_batch_tokens_sum") - rows0 - sum(renewed)
    batches = metric(port, "tandem_batch_tokens_count") - batches0
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"errors: {errors[:3]}")
    rows_per_batch = rows / batches if batches else 0.0
    if batches:
        print(f"  {n_sessions} sessions: {batches:.0f} batches of {rows_per_batch:.1f} rows, "
              f"{1000 * cpu / batches:.1f} ms of server CPU per batch", file=sys.stderr)
    return {"server": rows / (t1 - t0), "client": sum(counts) / seconds,
            "per_cpu_s": rows / cpu if cpu > 0 else 0.0, "rows_per_batch": rows_per_batch}


def step_latency(port, n_steps=100):
    conn = Conn(port)
    sid = new_session(conn)
    status, body = conn.post(f"/tandem/v1/sessions/{sid}/step",
                             {"expected_pos": 0, "append": [2, 818, 5279, 529, 7001, 563],
                              "generate": {"n": 1}})
    pos, last = body["pos"], body["tokens"][-1]
    times = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        status, body = conn.post(f"/tandem/v1/sessions/{sid}/step",
                                 {"expected_pos": pos, "append": [last], "generate": {"n": 1}})
        times.append((time.perf_counter() - t0) * 1000)
        pos, last = body["pos"], body["tokens"][-1]
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def bare_decode_ms(args):
    out = subprocess.run(["taskset", "-c", args.server_cores, args.tandem, "bench", "-m", args.model,
                          "-p", "0", "-n", "128", "-t", str(args.threads), "-r", "5", "--json"],
                         capture_output=True, text=True, check=True)
    return 1000.0 / json.loads(out.stdout)["tg"]["tok_s"]


def bytes_per_step(port, contexts):
    rows = []
    for n_ctx in contexts:
        history = [2] + [(i * 104729) % 200000 + 1000 for i in range(n_ctx - 1)]
        conn = Conn(port)
        sid = new_session(conn)
        conn.post(f"/tandem/v1/sessions/{sid}/step", {"expected_pos": 0, "append": history})
        conn.sent = conn.received = 0
        status, body = conn.post(f"/tandem/v1/sessions/{sid}/step",
                                 {"expected_pos": n_ctx, "append": [1234], "generate": {"n": 1}})
        native = (conn.sent, conn.received)
        conn.sent = conn.received = 0
        conn.post("/v1/completions", {"prompt": history + [1234], "max_tokens": 1,
                                      "temperature": 0, "logprobs": 1})
        rows.append({"context": n_ctx, "native_up": native[0], "native_down": native[1],
                     "openai_up": conn.sent, "openai_down": conn.received})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default=os.environ.get("TANDEM_MODEL") or subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "fetch_model.sh")], capture_output=True,
        text=True).stdout.strip())
    ap.add_argument("--server-cores", default="1")
    ap.add_argument("--client-cores", default="0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sessions", default="1,8,32,64")
    ap.add_argument("--contexts", default="64,256,1024,2048")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an extra argument for tandem serve (repeatable), e.g. --server-arg=--no-repack")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.sched_setaffinity(0, {int(c) for c in args.client_cores.split(",")})

    result = {"model": args.model, "server_cores": args.server_cores, "threads": args.threads}
    proc, port = start_server(args)
    try:
        tp = {}
        for n in [int(x) for x in args.sessions.split(",")]:
            reps = [throughput(port, n, args.seconds, proc.pid) for _ in range(args.reps)]

            def stat(key):
                v = sorted(r[key] for r in reps)
                return statistics.median(v), v[0], v[-1]

            med, lo, hi = stat("server")
            cli, cli_lo, cli_hi = stat("client")
            cpu, cpu_lo, cpu_hi = stat("per_cpu_s")
            tp[n] = {"median": med, "min": lo, "max": hi, "client_median": cli,
                     "client_min": cli_lo, "client_max": cli_hi, "per_cpu_s": cpu,
                     "per_cpu_s_min": cpu_lo, "per_cpu_s_max": cpu_hi,
                     "rows_per_batch": stat("rows_per_batch")[0]}
            print(f"throughput {n:3d} sessions: {med:8.1f} tok/s ({lo:.1f}..{hi:.1f}); clients "
                  f"counted {cli:.1f}; {cpu:8.1f} tok per server CPU-s ({cpu_lo:.1f}..{cpu_hi:.1f})",
                  file=sys.stderr)
        base = tp[min(tp)]["median"]
        base_client = tp[min(tp)]["client_median"]
        base_cpu = tp[min(tp)]["per_cpu_s"]
        for n in tp:
            tp[n]["ratio"] = tp[n]["median"] / base
            tp[n]["ratio_client"] = tp[n]["client_median"] / base_client if base_client else 0.0
            tp[n]["ratio_per_cpu_s"] = tp[n]["per_cpu_s"] / base_cpu if base_cpu else 0.0
            print(f"ratio {n:3d} sessions / {min(tp)}: {tp[n]['ratio']:.2f}x (clients' count "
                  f"{tp[n]['ratio_client']:.2f}x, per CPU-s {tp[n]['ratio_per_cpu_s']:.2f}x)",
                  file=sys.stderr)
        result["throughput"] = tp
        p50, p95 = step_latency(port)
        result["step_ms"] = {"p50": p50, "p95": p95}
        result["bytes"] = bytes_per_step(port, [int(x) for x in args.contexts.split(",")])
    finally:
        proc.terminate()
        proc.wait()
    result["bare_decode_ms"] = bare_decode_ms(args)
    result["step_overhead"] = result["step_ms"]["p50"] / result["bare_decode_ms"] - 1
    print(f"step latency p50 {p50:.2f} ms, p95 {p95:.2f} ms; bare decode step "
          f"{result['bare_decode_ms']:.2f} ms (overhead {100 * result['step_overhead']:.1f}%)",
          file=sys.stderr)
    for r in result["bytes"]:
        print(f"context {r['context']:5d}: native up {r['native_up']} down {r['native_down']} B; "
              f"stateless /v1/completions up {r['openai_up']} down {r['openai_down']} B",
              file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
