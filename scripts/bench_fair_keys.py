#!/usr/bin/env python3
"""One key's flood against another key's session steps (issue 32; docs/server.md, "Fair shares
between keys").

  scripts/bench_fair_keys.py BINARY [--model M] [--steps 40] [--flood-steps 20]
                             [--prompt 3000] [--conns 8] [--step-timeout 60]

Starts `BINARY serve` with a key file of two clients. Key B opens a native session and takes
--steps steps alone, each appending 4 tokens and generating 1 (prefill work, like a device's
verify step); then key A keeps --conns connections busy with --prompt-token prompts asking for
their prompt log-probabilities (/v1/completions, echo + logprobs, max_tokens 1), and B takes
--flood-steps more steps. A step that takes longer than --step-timeout seconds counts as timed
out and ends the run under the flood. Prints B's step p50/p99 in ms, alone and under the flood,
and how many A requests ended meanwhile.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import tempfile
import threading
import time

from netutil import free_port

A_KEY = "flood-key-0123456789"
B_KEY = "device-key-0123456789"


def post(conn, key, path, body):
    conn.request("POST", path, json.dumps(body),
                 {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    r = conn.getresponse()
    data = r.read()
    return r.status, json.loads(data) if data else {}


def pct(lat, q):
    lat = sorted(lat)
    return lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))] if lat else float("nan")


def b_steps(port, sid, pos, n, timeout):
    """n steps of 4 appended tokens; returns (latencies ms, pos, timed_out)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        try:
            st, d = post(c, B_KEY, f"/tandem/v1/sessions/{sid}/step",
                         {"expected_pos": pos, "append": [818 + (i + pos) % 500] * 4,
                          "generate": {"n": 1}})
        except (socket.timeout, TimeoutError):
            return lat, pos, True
        assert st == 200, d
        lat.append((time.perf_counter() - t0) * 1000)
        pos = d["pos"]
        if pos > 900:  # stay inside the context
            post(c, B_KEY, f"/tandem/v1/sessions/{sid}/step", {"expected_pos": 8, "rewind_to": 8})
            pos = 8
    return lat, pos, False


def flood(port, prompt_len, stop, done, idx):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = {"prompt": [(2 + 7 * idx + i) % 30000 + 100 for i in range(prompt_len)],
            "max_tokens": 1, "echo": True, "logprobs": 1}
    while not stop.is_set():
        try:
            post(c, A_KEY, "/v1/completions", body)
        except OSError:
            return
        done[0] += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--model", default=os.environ.get("TANDEM_MODEL") or os.path.expanduser(
        "~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--flood-steps", type=int, default=20)
    ap.add_argument("--prompt", type=int, default=3000)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--step-timeout", type=float, default=60)
    a = ap.parse_args()
    keys = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    keys.write(f"flood {A_KEY}\ndevice {B_KEY}\n")
    keys.close()
    port = free_port()
    server = subprocess.Popen([a.binary, "serve", "-m", a.model, "--port", str(port), "-t", "2",
                               "--api-key-file", keys.name, "--max-queue-per-key", "16",
                               "-c", "4096"], stderr=subprocess.DEVNULL)
    stop = threading.Event()
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        sid = post(c, B_KEY, "/tandem/v1/sessions", {})[1]["session"]
        st, d = post(c, B_KEY, f"/tandem/v1/sessions/{sid}/step",
                     {"expected_pos": 0, "append": [2] + [818] * 7})
        alone, pos, _ = b_steps(port, sid, d["pos"], a.steps, a.step_timeout)
        done = [0]
        threads = [threading.Thread(target=flood, args=(port, a.prompt, stop, done, i), daemon=True)
                   for i in range(a.conns)]
        for t in threads:
            t.start()
        time.sleep(2)  # A's requests tokenized, admitted and prefilling
        before = done[0]
        t0 = time.perf_counter()
        busy, pos, timed_out = b_steps(port, sid, pos, a.flood_steps, a.step_timeout)
        wall = time.perf_counter() - t0
        print(f"binary {a.binary}")
        print(f"B alone:     {len(alone)} steps  p50 {pct(alone, .5):.1f} ms  "
              f"p99 {pct(alone, .99):.1f} ms")
        print(f"B under A:   {len(busy)} of {a.flood_steps} steps done"
              f"{' (then one timed out after %.0f s)' % a.step_timeout if timed_out else ''}  "
              f"p50 {pct(busy, .5):.1f} ms  p99 {pct(busy, .99):.1f} ms  "
              f"({wall:.1f} s, {done[0] - before} A requests ended meanwhile)")
    finally:
        stop.set()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        os.unlink(keys.name)


if __name__ == "__main__":
    main()
