"""Two `tandem serve` replicas behind HAProxy on 127.0.0.1 (deploy/haproxy-two-replicas.cfg):
sessions are spread over both, every step of a session reaches the replica that holds it, and a
replica restart looks to a device like docs/deploy.md says: 410 (reason "unknown"), then a
replay into a new session gives the same tokens.

Usage: test_haproxy.py TANDEM_BINARY MODEL.gguf CONFIG   (exit 77: haproxy not installed)
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TANDEM, MODEL, CONFIG = sys.argv[1:4]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_ok(url, deadline_s=60):
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            if call(url)[0] == 200:
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200")


def start_replica(port, prefix):
    p = subprocess.Popen([TANDEM, "serve", "-m", MODEL, "--port", str(port), "-t", "1",
                          "--session-prefix", prefix, "--max-connections-per-ip", "0"],
                         stderr=subprocess.DEVNULL)
    wait_ok(f"http://127.0.0.1:{port}/health")
    return p


def wait_both_up(base, deadline_s=60):
    """Creates (idle) sessions through the proxy until one lands on each replica: only then does
    HAProxy's round robin include both. Idle sessions cost nothing here."""
    seen, deadline = set(), time.time() + deadline_s
    while time.time() < deadline:
        try:
            status, body = call(base + "/tandem/v1/sessions", {})
        except ValueError:  # HAProxy's own 503 page is not JSON
            status, body = 503, {}
        if status == 201:
            seen.add(body["session"][:3])
            if seen == {"r1-", "r2-"}:
                return
        time.sleep(0.2)
    raise RuntimeError(f"HAProxy did not route to both replicas within {deadline_s} s: {seen}")


def main():
    if not shutil.which("haproxy"):
        print("skipped: haproxy is not installed (scripts/setup.sh installs it)")
        return 77
    front, p1, p2 = free_port(), free_port(), free_port()
    r1, r2 = start_replica(p1, "r1-"), start_replica(p2, "r2-")
    env = dict(os.environ, FRONT_ADDR=f"127.0.0.1:{front}", R1_ADDR=f"127.0.0.1:{p1}",
               R2_ADDR=f"127.0.0.1:{p2}")
    proxy = subprocess.Popen(["haproxy", "-db", "-f", CONFIG], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{front}"
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    try:
        wait_ok(base + "/health")
        wait_both_up(base)
        prompt = [1, 450, 996, 1354, 1701, 299]
        sessions = []
        for _ in range(8):
            status, body = call(base + "/tandem/v1/sessions", {})
            check(status == 201, f"create via proxy: {status} {body}")
            sessions.append(body["session"])
        prefixes = {s[:3] for s in sessions}
        check(prefixes == {"r1-", "r2-"}, f"sessions spread over both replicas: {prefixes}")

        outputs = {}
        for s in sessions:
            pos, toks = 0, []
            for k in range(4):
                status, body = call(f"{base}/tandem/v1/sessions/{s}/step",
                                    {"expected_pos": pos, "append": prompt if k == 0 else [],
                                     "generate": {"n": 3}})
                check(status == 200, f"step {k} of {s}: {status} {body}")
                if status != 200:
                    break
                pos, toks = body["pos"], toks + body["tokens"]
            outputs[s] = toks
        check(len({json.dumps(v) for v in outputs.values()}) == 1,
              "both replicas give the same greedy tokens for the same prompt")
        want = next(iter(outputs.values()))

        # Restart replica 1: its sessions are gone (410, reason unknown); replaying the history
        # into a new session through the proxy continues exactly.
        r1.terminate()
        r1.wait(timeout=30)
        r1 = start_replica(p1, "r1-")
        wait_both_up(base)  # HAProxy's health check must see it again (1 s apart, slower under load)
        lost = [s for s in sessions if s.startswith("r1-")]
        for s in lost:
            status, body = call(f"{base}/tandem/v1/sessions/{s}/step",
                                {"expected_pos": len(prompt) + len(want), "generate": {"n": 3}})
            check(status == 410 and body["error"]["reason"] == "unknown",
                  f"restarted replica answers 410 unknown: {status} {body}")
        status, body = call(base + "/tandem/v1/sessions", {})
        fresh = body["session"]
        history = prompt + want[:6]
        status, body = call(f"{base}/tandem/v1/sessions/{fresh}/step",
                            {"expected_pos": 0, "append": history, "generate": {"n": 6}})
        check(status == 200 and body["tokens"] == want[6:12],
              f"replay continues exactly: {status} {body}")
    finally:
        proxy.terminate()
        for p in (r1, r2):
            p.terminate()
        for p in (proxy, r1, r2):
            p.wait(timeout=30)
    print(f"{'FAILED' if failures else 'ok'}: haproxy with two replicas")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
