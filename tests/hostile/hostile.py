#!/usr/bin/env python3
"""The hostile suite: one real `tandem serve` with the real model on 127.0.0.1, attacked the way
issue 21 describes while an honest device keeps stepping a native session greedily.

Usage: hostile.py TANDEM_BINARY [--model M.gguf] [--out REPORT.json] [--only NAME,...]

For every attack it checks: the server process is alive, /health answered within 1 s throughout
(polled every 200 ms from another thread), the honest device's greedy tokens equal its no-attack
tokens, its step p99 is within 3x of the no-attack p99 (plus a slack an attack names, issue 32: 100 ms for
unread), and the server's RSS (VmRSS, polled every
50 ms) stays under a cap derived from the flags. Attack-specific checks come on top (e.g. a nested
body must get 400). It prints one table, writes it as JSON to --out and as markdown beside it
(same name, .md), and exits 1 naming every failed check; 77 when the model is missing.

The honest device and the /health poller connect from 127.0.0.2, the attackers from 127.0.0.1:
both are loopback, so a per-address connection cap bites the attacker only, as it would on the
internet. After an attack that killed or wedged the server (a probe step not answered within
10 s), the server is restarted so that the next attack is measured on its own; the table says so.
Python 3 standard library only.
"""
import argparse
import http.client
import json
import math
import os
import random
import re
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time

HONEST_ADDR = "127.0.0.2"
ATTACK_ADDR = "127.0.0.1"
HOST = "127.0.0.1"
SKIP = 77
MIB = 1 << 20

HONEST_PROMPT = "The history of the Roman Empire begins with"
HONEST_TOKENS = 48
P99_FACTOR = 3.0
HEALTH_LIMIT_S = 1.0
# Bytes above the idle RSS a correct server may use: every session's KV (--kv-cap) plus this.
RSS_HEADROOM = 192 * MIB


def default_model():
    env = os.environ.get("TANDEM_MODEL")
    if env:
        return env
    cache = os.environ.get("TANDEM_CACHE", os.path.expanduser("~/.cache/tandem"))
    return os.path.join(cache, "models", "gemma-3-270m-q4_k_m.gguf")


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def p99(values):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[max(0, math.ceil(0.99 * len(v)) - 1)]


# ---------------------------------------------------------------------------------------------
# HTTP


class Http:
    """One keep-alive connection from a chosen source address; reconnects after errors."""

    def __init__(self, port, key=None, source=ATTACK_ADDR, timeout=30):
        self.port, self.key, self.source, self.timeout = port, key, source, timeout
        self.conn = None

    def close(self):
        if self.conn:
            self.conn.close()
        self.conn = None

    def request(self, method, path, body=None, timeout=None):
        """(status, parsed JSON or raw bytes); raises OSError/HTTPException on transport errors."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout or self.timeout,
                                                   source_address=(self.source, 0))
        self.conn.timeout = timeout or self.timeout
        if self.conn.sock:
            self.conn.sock.settimeout(self.conn.timeout)
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = "Bearer " + self.key
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        try:
            self.conn.request(method, path, body=body, headers=headers)
            r = self.conn.getresponse()
            data = r.read()
            if r.getheader("Connection", "").lower() == "close":
                self.close()
        except Exception:
            self.close()
            raise
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data

    def post(self, path, body, timeout=None):
        return self.request("POST", path, body, timeout)


def error_code(body):
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        e = body["error"]
        return e.get("code"), e.get("reason")
    return None, None


def raw_request(path, body, key, content_type="application/json"):
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n")
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    return head.encode() + b"\r\n" + body


def raw_socket(port, source=ATTACK_ADDR, rcvbuf=None, timeout=5):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect((HOST, port))
    return s


# ---------------------------------------------------------------------------------------------
# The server


class Server:
    def __init__(self, binary, model, flags, log_path):
        self.binary, self.model, self.flags, self.log_path = binary, model, flags, log_path
        self.proc = None
        self.port = None
        self.auth_args = []
        self.kv_cap = 0
        self.restarts = 0

    def start(self, auth_args, port=None, timeout=120):
        self.auth_args = auth_args
        self.port = port or free_port()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "serve", "-m", self.model, "--host", HOST, "--port", str(self.port),
             *self.flags, *auth_args], stdout=log, stderr=log)
        log.close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                status, _ = Http(self.port, source=HONEST_ADDR, timeout=2).request("GET", "/health")
                if status == 200:
                    self.kv_cap = self.read_kv_cap()
                    return True
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        self.stop()
        return False

    def read_kv_cap(self):
        with open(self.log_path, "rb") as f:
            caps = re.findall(rb"KV cap ([0-9.]+) MiB", f.read())
        return int(float(caps[-1]) * MIB) if caps else 0

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def exit_text(self):
        rc = self.proc.poll() if self.proc else None
        if rc is None:
            return "running"
        return f"killed by signal {-rc}" if rc < 0 else f"exited {rc}"

    def rss(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self, grace_s=15):
        """SIGTERM, then SIGKILL after grace_s. True when SIGTERM alone stopped it."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return False
        return True

    def restart(self):
        """Returns a note when SIGTERM did not stop the wedged server within 5 s."""
        stopped = self.stop(grace_s=5)
        self.restarts += 1
        # The same port: a device reconnects where the server was.
        if not self.start(self.auth_args, self.port):
            raise RuntimeError("the server did not come back after a restart; see " + self.log_path)
        return "" if stopped else " (SIGTERM did not stop it within 5 s: SIGKILL)"


def start_with_two_clients(server):
    """Starts the server with two credentials when it can tell them apart, else one shared key.
    Returns (honest key, attacker key, description)."""
    honest, mallory = "hk-" + os.urandom(12).hex(), "mk-" + os.urandom(12).hex()
    key_file = tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False)
    # Named clients, one per line, in the two spellings a key file is likely to take.
    for fmt in ("{name}:{key}", "{name} {key}"):
        with open(key_file.name, "w") as f:
            f.write(fmt.format(name="honest", key=honest) + "\n")
            f.write(fmt.format(name="mallory", key=mallory) + "\n")
        if server.start(["--api-key-file", key_file.name]):
            ok = [Http(server.port, k).request("GET", "/tandem/v1/info")[0] == 200
                  for k in (honest, mallory)]
            if all(ok):
                return honest, mallory, f"--api-key-file, two named clients ('{fmt}')"
            server.stop()
    if not server.start(["--api-key", honest]):
        raise RuntimeError("tandem serve did not start; see " + server.log_path)
    return honest, honest, "--api-key (one shared key: named clients not supported)"


# ---------------------------------------------------------------------------------------------
# Watchers: /health latency and RSS


class Monitor:
    def __init__(self, server):
        self.server = server
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.reset()
        threading.Thread(target=self.health_loop, daemon=True).start()
        threading.Thread(target=self.rss_loop, daemon=True).start()

    def reset(self):
        with self.lock:
            self.health_max = 0.0
            self.health_bad = 0
            self.rss_peak = 0
            self.inflight_since = None

    def snapshot(self):
        """(max /health latency so far, counting a poll still waiting; polls not answered 200;
        peak RSS)."""
        with self.lock:
            waiting = time.monotonic() - self.inflight_since if self.inflight_since else 0.0
            return max(self.health_max, waiting), self.health_bad, self.rss_peak

    def health_loop(self):
        client, port = None, None
        while not self.stop_flag.is_set():
            if port != self.server.port:
                client, port = Http(self.server.port, source=HONEST_ADDR, timeout=60), self.server.port
            t0 = time.monotonic()
            with self.lock:
                self.inflight_since = t0
            try:
                ok = client.request("GET", "/health")[0] == 200
            except (OSError, http.client.HTTPException):
                ok = False
            dt = time.monotonic() - t0
            with self.lock:
                if self.inflight_since == t0 and self.server.alive():
                    self.health_max = max(self.health_max, dt)
                    self.health_bad += 0 if ok else 1
                self.inflight_since = None
            time.sleep(0.2)

    def rss_loop(self):
        while not self.stop_flag.is_set():
            if self.server.alive():
                r = self.server.rss()
                with self.lock:
                    self.rss_peak = max(self.rss_peak, r)
            time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# The honest device


class HonestRun:
    """Greedy continuation, one token per step, in a new native session."""

    def __init__(self, port, key, prompt, n=HONEST_TOKENS, deadline_s=45, pause_after=None):
        self.port, self.key, self.prompt, self.n = port, key, prompt, n
        self.deadline = time.monotonic() + deadline_s
        self.pause_after = pause_after
        self.paused, self.resume = threading.Event(), threading.Event()
        self.ids, self.latencies, self.retries = [], [], 0
        self.error = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def join(self):
        self.thread.join(max(0.0, self.deadline - time.monotonic()) + 5)
        if self.thread.is_alive() and not self.error:
            self.error = "did not finish"
        self.paused.set()

    def call(self, client, path, body):
        """Retries 429/503 (a device backs off and decodes locally meanwhile) until the deadline."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{path}: no answer before the deadline")
            try:
                status, data = client.post(path, body, timeout=left)
            except (OSError, http.client.HTTPException) as e:
                raise RuntimeError(f"{path}: {type(e).__name__} {e}")
            if status in (429, 503):
                self.retries += 1
                time.sleep(0.1)
                continue
            return status, data

    def run(self):
        client = Http(self.port, self.key, source=HONEST_ADDR)
        try:
            status, data = self.call(client, "/tandem/v1/sessions", {})
            if status != 201:
                raise RuntimeError(f"create: {status} {data}")
            sid, pos, append = data["session"], 0, list(self.prompt)
            for i in range(self.n):
                t0 = time.monotonic()
                status, data = self.call(client, f"/tandem/v1/sessions/{sid}/step",
                                         {"expected_pos": pos, "append": append,
                                          "generate": {"n": 1}})
                if status != 200:
                    code, reason = error_code(data)
                    raise RuntimeError(f"step {i}: {status} {code} {reason or ''}".strip())
                if i > 0:  # the first step also prefills the prompt; p99 is about decode steps
                    self.latencies.append(time.monotonic() - t0)
                self.ids += data["tokens"]
                pos, append = data["pos"], []
                if self.pause_after == i + 1:
                    self.paused.set()
                    self.resume.wait(60)
            client.request("DELETE", f"/tandem/v1/sessions/{sid}", timeout=10)
        except Exception as e:  # recorded and reported; never fatal to the suite
            self.error = str(e)
        finally:
            self.paused.set()
            client.close()


# ---------------------------------------------------------------------------------------------
# Attacks. Each returns (outcome text, [failed attack-specific checks]).


def nested(depth, leaf):
    return "[" * depth + leaf + "]" * depth


def attack_nested(s):
    """Deeply nested JSON on every route that parses a body: 400, never a crash."""
    depth = 100_000
    arr = nested(depth, '"hi"')
    obj = '{"a":' * depth + "1" + "}" * depth
    sid = s.attacker_session()
    bodies = [
        ("/v1/completions prompt", "/v1/completions", '{"max_tokens":1,"prompt":' + arr + "}"),
        ("/v1/completions nested object", "/v1/completions",
         '{"max_tokens":1,"prompt":"hi","extra":' + obj + "}"),
        ("/generate sampling_params", "/generate",
         '{"text":"hi","sampling_params":{"max_new_tokens":1,"x":' + nested(depth, "1") + "}}"),
        ("/v1/chat/completions content", "/v1/chat/completions",
         '{"max_tokens":1,"messages":[{"role":"user","content":' + arr + "}]}"),
        ("native step append", f"/tandem/v1/sessions/{sid}/step",
         '{"expected_pos":0,"generate":{"n":1},"append":' + nested(depth, "2") + "}"),
        ("/tokenize content", "/tokenize", '{"content":' + arr + "}"),
    ]
    seen, failures = [], []
    for name, path, body in bodies:
        try:
            status, _ = Http(s.server.port, s.mallory).post(path, body, timeout=20)
            seen.append(f"{name}: {status}")
            if status != 400:
                failures.append(f"{name}: answered {status}, expected 400")
        except (OSError, http.client.HTTPException) as e:
            time.sleep(0.3)
            what = "server died (" + s.server.exit_text() + ")" if not s.server.alive() else \
                type(e).__name__
            seen.append(f"{name}: {what}")
            failures.append(f"{name}: {what}")
        if not s.server.alive():
            s.note_restart(f"after {name}")
            s.server.restart()
            sid = s.attacker_session()
    return "; ".join(seen), failures


def attack_tokenizer(s):
    """Two concurrent 1 MB /tokenize bodies of '<' after random text, and a chat turn alike."""
    rnd = random.Random(21)
    printable = string.ascii_letters + string.digits + string.punctuation
    text = "".join(rnd.choice(printable) for _ in range(60_000)) + "<" * 940_000
    bodies = [("/tokenize", json.dumps({"content": text})),
              ("/tokenize", json.dumps({"content": text})),
              ("/v1/chat/completions", json.dumps({"max_tokens": 1, "messages": [
                  {"role": "user", "content": text}]}))]
    results = [None] * len(bodies)

    def send(i, path, body):
        t0 = time.monotonic()
        try:
            status, _ = Http(s.server.port, s.mallory).post(path, body, timeout=45)
            results[i] = f"{path} {status} in {time.monotonic() - t0:.1f} s"
        except (OSError, http.client.HTTPException) as e:
            results[i] = f"{path} no answer in {time.monotonic() - t0:.0f} s ({type(e).__name__})"

    threads = [threading.Thread(target=send, args=(i, p, b)) for i, (p, b) in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failures = [r for r in results if "no answer" in r]
    return "; ".join(results), failures


def hamming(a, b):
    return bin(a ^ b).count("1")


def splitmix_mix(z):
    m = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def predict_counter_ids(ids):
    """Today's ids are mix(salt + K*n) ‖ (n ^ salt): from one id, a small counter n reveals the
    salt, and with it every other id. Returns how many of ids[1:] were predicted from ids[0]."""
    h = ids[0][-32:]
    if not re.fullmatch(r"[0-9a-f]{32}", h):
        return 0
    hi, lo = int(h[:16], 16), int(h[16:], 16)
    for n in range(1, 1 << 16):
        salt = lo ^ n
        if splitmix_mix((salt + 0x9E3779B97F4A7C15 * n) & ((1 << 64) - 1)) == hi:
            predicted = set()
            for m in range(n + 1, n + 4097):
                z = splitmix_mix((salt + 0x9E3779B97F4A7C15 * m) & ((1 << 64) - 1))
                predicted.add(f"{z:016x}{m ^ salt:016x}")
            return sum(1 for i in ids[1:] if i[-32:] in predicted)
    return 0


def attack_sessions(s):
    """Client B steps, rewinds, closes and lists client A's sessions; ids must be random."""
    a = Http(s.server.port, s.honest)
    b = Http(s.server.port, s.mallory)
    ids = []
    for _ in range(4):
        status, data = a.post("/tandem/v1/sessions", {})
        if status != 201:
            return f"A could not create sessions ({status})", [f"create as A: {status}"]
        ids.append(data["session"])
    victim = ids[0]
    a.post(f"/tandem/v1/sessions/{victim}/step",
           {"expected_pos": 0, "append": s.prompt, "generate": {"n": 1}})
    unknown = "".join(random.choice("0123456789abcdef") for _ in range(len(victim)))
    step = {"expected_pos": len(s.prompt) + 1, "append": [], "generate": {"n": 4}, "top_n": 5}
    rewind = {"rewind_to": 0, "expected_pos": 0, "append": [2], "generate": {"n": 1}}
    failures, seen = [], []

    def same_as_unknown(name, method, suffix, body):
        got = b.request(method, f"/tandem/v1/sessions/{victim}{suffix}", body)
        ref = b.request(method, f"/tandem/v1/sessions/{unknown}{suffix}", body)
        gs, rs = (got[0], error_code(got[1])), (ref[0], error_code(ref[1]))
        seen.append(f"B {name}: {got[0]}")
        if gs != rs or got[0] not in (404, 410):
            failures.append(f"B {name} of A's session answered {gs}, an unknown id {rs}")

    same_as_unknown("step", "POST", "/step", step)
    same_as_unknown("rewind", "POST", "/step", rewind)
    same_as_unknown("delete", "DELETE", "", None)
    status, data = a.post(f"/tandem/v1/sessions/{victim}/step",
                          {"expected_pos": len(s.prompt) + 1, "append": [], "generate": {"n": 1}})
    if status != 200:
        failures.append(f"A's own session after B's attempts: {status} {error_code(data)}")
    status, data = b.request("GET", "/tandem/v1/sessions")
    listed = [i for i in ids if i in json.dumps(data)]
    seen.append(f"B list: {status}, {len(listed)} of A's ids")
    if status == 200 and listed:
        failures.append(f"B's GET /tandem/v1/sessions lists {len(listed)} of A's session ids")
    # Randomness: 128 bits of hex, consecutive ids unrelated, not derivable from one another.
    more = []
    for _ in range(12):
        status, data = b.post("/tandem/v1/sessions", {})
        if status == 201:
            more.append(data["session"])
    for i in ids + more:
        a.request("DELETE", f"/tandem/v1/sessions/{i}")
        b.request("DELETE", f"/tandem/v1/sessions/{i}")
    all_ids = ids + more
    hexes = [re.sub(r"[^0-9a-fA-F]", "", i) for i in all_ids]
    if min(len(h) for h in hexes) < 32:
        failures.append(f"ids carry fewer than 128 bits of hex ({all_ids[0]})")
    low = [int(h[-16:], 16) for h in hexes]
    mean_low = sum(hamming(x, y) for x, y in zip(low, low[1:])) / max(1, len(low) - 1)
    seen.append(f"consecutive ids' last 64 bits differ in {mean_low:.1f} bits on average")
    if mean_low < 20:
        failures.append(f"consecutive ids' last 64 bits differ in {mean_low:.1f} bits (random: 32)")
    predicted = predict_counter_ids(all_ids)
    if predicted:
        seen.append(f"{predicted} of {len(all_ids) - 1} ids computed from the first")
        failures.append(f"{predicted} of {len(all_ids) - 1} session ids computed from one id")
    a.close()
    b.close()
    return "; ".join(seen), failures


def attack_abandoned(s):
    """64 sampled max_tokens=4096 requests whose clients hang up at once; others still served."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4096, "temperature": 1.0,
                       "ignore_eos": True}).encode()
    sent = 0
    for _ in range(64):
        try:
            sock = raw_socket(s.server.port)
            sock.sendall(raw_request("/v1/completions", body, s.mallory))
            sock.close()
            sent += 1
        except OSError:
            pass
    time.sleep(1.0)
    # Afterwards: short requests of another client must be served, not refused for long.
    c = Http(s.server.port, s.honest, source=HONEST_ADDR)
    deadline, served, refused, failures = time.monotonic() + 20, 0, 0, []
    while served < 5 and time.monotonic() < deadline:
        try:
            status, _ = c.post("/v1/completions", {"prompt": "Hello", "max_tokens": 1,
                                                   "temperature": 0},
                               timeout=max(0.1, deadline - time.monotonic()))
        except (OSError, http.client.HTTPException):
            break
        if status == 200:
            served += 1
        else:
            refused += 1
            time.sleep(0.2)
    c.close()
    if served < 5:
        failures.append(f"after the hang-ups only {served} of 5 short requests were served in 20 s"
                        f" ({refused} refused)")
    return f"{sent} abandoned; then {served}/5 short requests served, {refused} refused", failures


def attack_churn(s):
    """Another client creates 64 sessions while the honest session sits idle between turns."""
    b = Http(s.server.port, s.mallory)
    counts, made = {}, []
    for _ in range(64):
        try:
            status, data = b.post("/tandem/v1/sessions", {}, timeout=10)
        except (OSError, http.client.HTTPException):
            status, data = "error", None
        counts[status] = counts.get(status, 0) + 1
        if status == 201:
            made.append(data["session"])
    for i in made:
        b.request("DELETE", f"/tandem/v1/sessions/{i}")
    b.close()
    return "64 creates: " + ", ".join(f"{n}x{k}" for k, n in sorted(counts.items(),
                                                                       key=str)), []


def attack_slowloris(s):
    """300 sockets that send nothing or half a header, from one address; they must be closed
    by a header deadline, and one address must not hold them all (per-address cap)."""
    socks, refused_at_connect = [], 0
    for i in range(300):
        try:
            sock = raw_socket(s.server.port, timeout=2)
            if i % 2:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
            socks.append(sock)
        except OSError:
            refused_at_connect += 1
    time.sleep(0.5)
    closed_early = sum(1 for sock in socks if closed_by_server(sock))
    t0, open_socks = time.monotonic(), [x for x in socks]
    while open_socks and time.monotonic() - t0 < 20:
        time.sleep(1.0)
        open_socks = [x for x in open_socks if not closed_by_server(x)]
    for sock in socks:
        sock.close()
    failures = []
    if open_socks:
        failures.append(f"{len(open_socks)} of {len(socks)} silent sockets still open 20 s later"
                        " (no header deadline)")
    if refused_at_connect + closed_early == 0:
        failures.append("one address held 300 connections (no per-address cap below 300)")
    return (f"{len(socks)} opened, {refused_at_connect} refused, {closed_early} closed at once, "
            f"{len(socks) - len(open_socks)} closed within 20 s"), failures


def closed_by_server(sock):
    """True when the server closed (or answered and closed) this socket."""
    sock.setblocking(False)
    try:
        data = sock.recv(65536)
        return data == b"" or data.startswith(b"HTTP/1.1 5") or data.startswith(b"HTTP/1.1 4")
    except BlockingIOError:
        return False
    except OSError:
        return True


def attack_streams(s):
    """SGLang streaming /generate with a big max_new_tokens: two clients never read, one reads
    slowly. The server may cut them; it must not grow without bound or slow the others."""
    body = json.dumps({"text": "Once upon a time", "stream": True,
                       "sampling_params": {"max_new_tokens": 4096, "temperature": 0,
                                           "ignore_eos": True}}).encode()
    # The slow reader first, so that it holds one of the stateless slots (--parallel 2).
    slow = raw_socket(s.server.port, rcvbuf=4096)
    slow.sendall(raw_request("/generate", body, s.mallory))
    slow.settimeout(1.0)
    idle = []
    for _ in range(2):
        sock = raw_socket(s.server.port, rcvbuf=4096)
        sock.sendall(raw_request("/generate", body, s.mallory))
        idle.append(sock)
    got, t0, ended = 0, time.monotonic(), False
    while time.monotonic() - t0 < 25:
        try:
            chunk = slow.recv(2048)
        except socket.timeout:
            continue
        except OSError:
            break
        if not chunk:
            ended = True
            break
        got += len(chunk)
        time.sleep(0.02)
    idle_closed = sum(1 for sock in idle if closed_by_server(sock))
    for sock in idle + [slow]:
        sock.close()
    return (f"slow reader got {got / MIB:.1f} MiB in {time.monotonic() - t0:.0f} s "
            f"({'ended' if ended else 'still streaming'}); {idle_closed}/2 non-readers dropped"), []


def attack_memory(s):
    """prompt_logprobs and echo+logprobs on a prompt that fills the context."""
    rnd = random.Random(7)
    prompt = [2] + [rnd.randrange(1000, 200000) for _ in range(s.n_ctx - 8)]
    c = Http(s.server.port, s.mallory, timeout=120)
    seen, failures = [], []
    for name, extra in (("prompt_logprobs", {"prompt_logprobs": 1}),
                        ("echo+logprobs", {"echo": True, "logprobs": 1})):
        try:
            status, _ = c.post("/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                                   "temperature": 0, **extra}, timeout=120)
            seen.append(f"{name}: {status}")
            if status >= 500:
                failures.append(f"{name}: {status}")
        except (OSError, http.client.HTTPException) as e:
            seen.append(f"{name}: {type(e).__name__}")
            failures.append(f"{name}: no answer")
    c.close()
    return f"{len(prompt)}-token prompt; " + "; ".join(seen), failures


def attack_smaller(s):
    """Stop strings on a long generation, float 2^63 fields, seed 2^32-1, a 413 after rewind."""
    c = Http(s.server.port, s.mallory, timeout=120)
    seen, failures = [], []
    t0 = time.monotonic()
    status, _ = c.post("/v1/completions", {
        "prompt": "Once upon a time", "max_tokens": 600, "temperature": 0, "ignore_eos": True,
        "stop": ["zq#never-1", "zq#never-2", "zq#never-3", "zq#never-4"]})
    seen.append(f"stop strings: {status} in {time.monotonic() - t0:.1f} s")
    status, data = c.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2.0 ** 63})
    seen.append(f"max_tokens 2^63 (float): {status}")
    if status != 400:
        failures.append(f"max_tokens 2^63 as a float: {status}, expected 400")
    answers = [c.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 1.0,
                                          "seed": 2.0 ** 63}) for _ in range(2)]
    seen.append(f"seed 2^63 (float): {answers[0][0]}")
    if answers[0][0] not in (200, 400) or (answers[0][0] == 200 and
                                           answers[0][1]["choices"][0]["text"] !=
                                           answers[1][1]["choices"][0]["text"]):
        failures.append(f"seed 2^63 as a float: {answers[0][0]}, not a stable answer or a 400")
    texts = set()
    for _ in range(2):
        status, data = c.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24,
                                                  "temperature": 1.0, "seed": 4294967295})
        texts.add(data["choices"][0]["text"] if status == 200 else f"status {status}")
    seen.append(f"seed 4294967295: {len(texts)} distinct texts of 2")
    if len(texts) != 1:
        failures.append("seed 4294967295 gives a different text each time (taken as 'no seed')")
    failures += rewind_413_keeps_history(s, c, seen)
    c.close()
    return "; ".join(seen), failures


def rewind_413_keeps_history(s, c, seen):
    status, data = c.post("/tandem/v1/sessions", {})
    if status != 201:
        return [f"create for the rewind check: {status}"]
    sid = data["session"]
    status, data = c.post(f"/tandem/v1/sessions/{sid}/step",
                          {"expected_pos": 0, "append": s.prompt, "generate": {"n": 1}})
    pos = data["pos"]
    too_long = {"rewind_to": 2, "expected_pos": 2, "append": [300] * (s.n_ctx - 4),
                "generate": {"n": 8}}
    status, _ = c.post(f"/tandem/v1/sessions/{sid}/step", too_long)
    status2, data2 = c.post(f"/tandem/v1/sessions/{sid}/step",
                            {"expected_pos": pos, "append": [], "generate": {"n": 1}})
    c.request("DELETE", f"/tandem/v1/sessions/{sid}")
    seen.append(f"rewind+too long: {status}, then step at {pos}: {status2}")
    if status != 413:
        return [f"a rewind with a too-long append answered {status}, expected 413"]
    if status2 != 200:
        return [f"the 413 cut the history: the next step at pos {pos} got {status2} "
                f"{error_code(data2)} pos {data2.get('error', {}).get('pos')}"]
    return []


def metric_values(s, prefix):
    """{series: value} of the /metrics lines that start with `prefix`."""
    status, text = Http(s.server.port, s.honest, source=HONEST_ADDR).request("GET", "/metrics")
    if status != 200 or not isinstance(text, bytes):
        return {}
    out = {}
    for line in text.decode().splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def detokenize_answered(s):
    return sum(v for k, v in metric_values(s, 'tandem_requests_total{route="/detokenize"').items())


UNREAD_CONNECTIONS, UNREAD_ADDRESSES, UNREAD_IDS = 60, 6, 200_000
WRITE_TOTAL = 64 * MIB  # --max-write-total's default
SMALL_ANSWER = 16 << 10


def attack_unread(s):
    """60 connections, 10 from each of 6 addresses, each POST /detokenize 200,000 ids of a 31-byte
    piece (0.8 MB body, 6.2 MB answer) and never read: the answers queued for them must stay
    within --max-write-total, and a client that reads must still get its whole answer."""
    status, data = Http(s.server.port, s.mallory).post(
        "/tokenize", {"content": " " * 31, "with_pieces": True, "add_special": False})
    piece = max(data["tokens"], key=lambda t: len(t["piece"].encode()))
    body = json.dumps({"tokens": [piece["id"]] * UNREAD_IDS}).encode()
    before = detokenize_answered(s)
    socks, refused = [], 0
    for i in range(UNREAD_CONNECTIONS):
        try:
            sock = raw_socket(s.server.port, source=f"127.0.0.{10 + i % UNREAD_ADDRESSES}",
                              rcvbuf=4096, timeout=10)
            sock.sendall(raw_request("/detokenize", body, s.mallory))
            socks.append(sock)
        except OSError:
            refused += 1
    # Until the server has dealt with every request (or 60 s): the queued total at its highest.
    deadline, queued = time.monotonic() + 60, -1.0
    while time.monotonic() < deadline:
        queued = max(queued, metric_values(s, "tandem_write_queued_bytes").get(
            "tandem_write_queued_bytes", -1))
        if detokenize_answered(s) >= before + len(socks):
            break
        time.sleep(0.2)
    time.sleep(1.5)  # the non-readers stall past --slow-reader-grace
    n = 20_000
    t0 = time.monotonic()
    try:
        status, data = Http(s.server.port, s.honest, source=HONEST_ADDR).post(
            "/detokenize", {"tokens": [piece["id"]] * n}, timeout=30)
    except (OSError, http.client.HTTPException) as e:
        status, data = type(e).__name__, None
    latency = time.monotonic() - t0
    whole = status == 200 and len(data["content"]) >= n * len(piece["piece"]) - 1
    for sock in socks:
        sock.close()
    failures = []
    if queued < 0:
        failures.append("no tandem_write_queued_bytes in /metrics")
    elif queued > WRITE_TOTAL + len(socks) * SMALL_ANSWER:
        failures.append(f"{queued / MIB:.0f} MiB of answers queued, over --max-write-total")
    if not whole:
        failures.append(f"a reading client's {n}-id /detokenize: {status}, not its whole answer")
    counts = metric_values(s, "tandem_answers_refused_total")
    counts.update(metric_values(s, "tandem_evicted_connections_total"))
    told = ", ".join(f"{k.split('{')[1].rstrip('}')} {v:.0f}" for k, v in counts.items())
    return (f"{len(socks)} sent, {refused} refused at connect; queued peak "
            f"{max(queued, 0) / MIB:.0f} MiB; reader: {status} in {latency:.2f} s; {told}"), failures


def attack_idle(s):
    """16 addresses x 64 keep-alive connections, one /health each, then idle: at the caps the
    oldest idle ones make way, so a newcomer from another address is served, not locked out."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    socks, served, refused = [], 0, 0
    for i in range(16 * 64):
        try:
            sock = raw_socket(s.server.port, source=f"127.0.0.{40 + i // 64}", timeout=5)
            sock.sendall(request)
            answer = sock.recv(4096)
            served += answer.startswith(b"HTTP/1.1 200")
            refused += not answer.startswith(b"HTTP/1.1 200")
            socks.append(sock)
        except OSError:
            refused += 1
    evicted = sum(1 for sock in socks if closed_by_server(sock))
    try:
        status, _ = Http(s.server.port, source="127.0.0.60", timeout=10).request("GET", "/health")
    except (OSError, http.client.HTTPException) as e:
        status = type(e).__name__
    for sock in socks:
        sock.close()
    failures = [] if status == 200 else [f"a newcomer after the idle connections: {status}"]
    return (f"{served} served and left idle, {refused} refused, {evicted} of them closed since; "
            f"newcomer: {status}"), failures


ATTACKS = [
    ("nested JSON (6 routes, depth 100k)", attack_nested, {}),
    ("tokenizer CPU (2x1 MB /tokenize + chat)", attack_tokenizer, {}),
    ("session guessing (B on A's sessions)", attack_sessions, {}),
    ("abandoned work (64 x 4096 tokens, hang up)", attack_abandoned, {}),
    ("churn (64 creates by another client)", attack_churn, {"pause_honest": True}),
    ("slowloris (300 silent sockets)", attack_slowloris, {}),
    ("unbounded output (SGLang streams)", attack_streams, {}),
    ("memory (prompt logprobs, full context)", attack_memory, {}),
    ("smaller (stop, 2^63, seed, 413 rewind)", attack_smaller, {}),
    # Issue 32's bound for this attack: 60 clients push 48 MB of request bodies through the same
    # two cores the honest device's steps run on, so its p99 may grow by 100 ms beyond 3x.
    ("unread (60 x 6.2 MB /detokenize answers)", attack_unread, {"p99_slack_s": 0.1}),
    ("idle (16 addresses x 64 keep-alive)", attack_idle, {}),
]


# ---------------------------------------------------------------------------------------------
# The suite


class Suite:
    def __init__(self, args):
        self.args = args
        self.n_ctx = args.ctx
        self.log_path = tempfile.NamedTemporaryFile(prefix="tandem-hostile-", suffix=".log",
                                                    delete=False).name
        flags = ["-c", str(args.ctx), "--max-sessions", "16", "--max-sessions-per-key", "8",
                 "--parallel", "2", "-t", "2",
                 "--http-threads", "2", "--max-connections", "512", "--max-sse", "8",
                 "--kv-cap", str(args.kv_cap_mib * MIB)]
        self.server = Server(args.binary, args.model, flags, self.log_path)
        self.honest, self.mallory, self.auth = start_with_two_clients(self.server)
        self.monitor = Monitor(self.server)
        self.restart_notes = []
        status, data = Http(self.server.port, self.honest).post(
            "/tokenize", {"content": HONEST_PROMPT})
        self.prompt = data["tokens"]

    def note_restart(self, why):
        self.restart_notes.append(why)

    def attacker_session(self):
        status, data = Http(self.server.port, self.mallory).post("/tandem/v1/sessions", {})
        return data["session"] if status == 201 else "none"

    def quiet(self):
        """The server answers a short honest step within 10 s."""
        if not self.server.alive():
            return False
        run = HonestRun(self.server.port, self.honest, self.prompt, n=2, deadline_s=10)
        run.run()
        if run.error is not None:
            return False
        # Stateless work too (abandoned requests clog the stateless slots, not the sessions).
        try:
            status, _ = Http(self.server.port, self.honest, source=HONEST_ADDR).post(
                "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "temperature": 0}, timeout=10)
            return status == 200
        except (OSError, http.client.HTTPException):
            return False

    def baseline(self):
        runs = [HonestRun(self.server.port, self.honest, self.prompt).start() for _ in range(1)]
        runs[0].join()
        second = HonestRun(self.server.port, self.honest, self.prompt).start()
        second.join()
        runs.append(second)
        for r in runs:
            if r.error:
                raise RuntimeError("the no-attack honest run failed: " + r.error)
        if runs[0].ids != runs[1].ids:
            raise RuntimeError("two no-attack greedy runs differ: the baseline is not stable")
        self.base_ids = runs[0].ids
        self.base_p99 = max(p99(r.latencies) for r in runs)
        _, _, rss = self.monitor.snapshot()
        self.rss_cap = rss + self.server.kv_cap + RSS_HEADROOM

    def run_attack(self, name, fn, pause_honest=False, p99_slack_s=0.0):
        restarted = []
        if not self.quiet():
            restarted.append("before: wedged or dead" + self.server.restart())
        self.restart_notes = []
        self.monitor.reset()
        rss_start = self.server.rss()
        t0 = time.monotonic()
        honest = HonestRun(self.server.port, self.honest, self.prompt,
                           pause_after=4 if pause_honest else None)
        result = {}

        def attack():
            try:
                result["outcome"], result["failures"] = fn(self)
            except Exception as e:
                result["outcome"], result["failures"] = f"attack raised {e!r}", [f"attack: {e!r}"]

        attacker = threading.Thread(target=attack, daemon=True)
        if pause_honest:  # the honest session is open and idle while the attack runs
            honest.start()
            honest.paused.wait(30)
            attacker.start()
            attacker.join()
            honest.resume.set()
        else:
            attacker.start()
            time.sleep(0.3)
            honest.start()
            attacker.join()
        honest.join()
        alive = self.server.alive()
        exit_text = self.server.exit_text()
        health_max, health_bad, rss_peak = self.monitor.snapshot()
        honest_p99 = p99(honest.latencies)
        failures = list(result["failures"])
        if not alive:
            failures.append(f"server down ({exit_text})")
        if health_max > HEALTH_LIMIT_S or health_bad:
            failures.append(f"/health max {health_max:.2f} s ({health_bad} not answered 200)")
        equal = honest.error is None and honest.ids == self.base_ids
        if honest.error:
            failures.append(f"honest device: {honest.error}")
        elif not equal:
            failures.append("honest greedy output differs from the baseline")
        if not (honest_p99 <= P99_FACTOR * self.base_p99 + p99_slack_s):
            slack = f" + {p99_slack_s * 1000:.0f} ms" if p99_slack_s else ""
            failures.append(f"honest step p99 {honest_p99 * 1000:.0f} ms > {P99_FACTOR:g}x "
                            f"baseline {self.base_p99 * 1000:.0f} ms{slack}")
        if rss_peak > self.rss_cap:
            failures.append(f"RSS peak {rss_peak / MIB:.0f} MiB > cap {self.rss_cap / MIB:.0f} MiB")
        if not alive or not self.quiet():
            restarted.append("after: wedged or dead" + self.server.restart())
        restarted += [f"mid-attack ({w})" for w in self.restart_notes]
        return {
            "attack": name, "outcome": result["outcome"], "passed": not failures,
            "failures": failures, "health_max_s": round(health_max, 3),
            "honest_p99_ms": None if math.isnan(honest_p99) else round(honest_p99 * 1000, 1),
            "baseline_p99_ms": round(self.base_p99 * 1000, 1), "honest_equal": equal,
            "honest_retries": honest.retries, "rss_peak_mib": round(rss_peak / MIB),
            "rss_start_mib": round(rss_start / MIB),
            "rss_cap_mib": round(self.rss_cap / MIB), "restarted": restarted,
            "seconds": round(time.monotonic() - t0, 1)}


def fmt_row(r):
    p = "-" if r["honest_p99_ms"] is None else f"{r['honest_p99_ms']:.0f}"
    outcome = ("PASS" if r["passed"] else "FAIL") + ": " + r["outcome"]
    if r["restarted"]:
        outcome += " [server restarted " + ", ".join(r["restarted"]) + "]"
    return [r["attack"], outcome, f"{r['health_max_s']:.2f} s",
            f"{p} ms ({r['baseline_p99_ms']:.0f} ms)", "yes" if r["honest_equal"] else "NO",
            f"{r['rss_peak_mib']} MiB (start {r['rss_start_mib']}, cap {r['rss_cap_mib']})"]


HEADER = ["attack", "outcome", "/health max", "honest p99 (baseline)", "honest output equal",
          "peak RSS"]


def markdown(rows):
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in fmt_row(r)) + " |")
    return "\n".join(lines) + "\n"


def plain_table(rows):
    cells = [HEADER] + [fmt_row(r) for r in rows]
    widths = [min(max(len(c[i]) for c in cells), 70 if i == 1 else 60) for i in range(len(HEADER))]
    out = []
    for c in cells:
        out.append(" | ".join(c[i][:widths[i]].ljust(widths[i]) for i in range(len(HEADER))))
        if c is HEADER:
            out.append("-+-".join("-" * w for w in widths))
    return "\n".join(out)


def only_p99_failed(row):
    return not row["passed"] and all(f.startswith("honest step p99") for f in row["failures"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--out", help="write the table as JSON here and as markdown beside it (.md)")
    ap.add_argument("--only", help="comma-separated attack name prefixes to run")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--kv-cap-mib", type=int, default=256)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"skipped: the real model is not at {args.model} (scripts/fetch_model.sh)")
        return SKIP
    t_start = time.monotonic()
    suite = Suite(args)
    try:
        suite.baseline()
        print(f"server: {' '.join(suite.server.flags)}; auth: {suite.auth}")
        print(f"baseline: {len(suite.base_ids)} greedy tokens, step p99 "
              f"{suite.base_p99 * 1000:.1f} ms; RSS cap {suite.rss_cap / MIB:.0f} MiB; "
              f"server log {suite.log_path}", flush=True)
        rows = []
        only = [o.strip() for o in args.only.split(",")] if args.only else None
        for name, fn, opts in ATTACKS:
            if only and not any(name.startswith(o) for o in only):
                continue
            r = suite.run_attack(name, fn, **opts)
            if only_p99_failed(r):
                # Step latency on a shared 2-core machine has outliers that no server can rule
                # out (the scheduler, other processes): an attack that failed on p99 alone is
                # measured once more, and the second measurement decides. Both are reported.
                first = r["honest_p99_ms"]
                r = suite.run_attack(name, fn, **opts)
                r["outcome"] = f"(p99 re-measured: first {first} ms) " + r["outcome"]
            rows.append(r)
            print(f"[{r['seconds']:5.1f} s] {'PASS' if r['passed'] else 'FAIL'} {name}",
                  flush=True)
    finally:
        suite.monitor.stop_flag.set()
        suite.server.stop()
    print()
    print(plain_table(rows))
    report = {"server_flags": suite.server.flags, "auth": suite.auth,
              "baseline": {"tokens": len(suite.base_ids), "p99_ms": round(suite.base_p99 * 1000, 1),
                           "rss_cap_mib": round(suite.rss_cap / MIB)},
              "seconds": round(time.monotonic() - t_start, 1), "attacks": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(markdown(rows))
    failed = [(r["attack"], f) for r in rows for f in r["failures"]]
    print(f"\n{len(rows) - len({a for a, _ in failed})} of {len(rows)} attacks passed in "
          f"{time.monotonic() - t_start:.0f} s")
    for attack, f in failed:
        print(f"FAILED: {attack}: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
