#!/usr/bin/env python3
"""Issue 32 item 1 replayed: answers nobody reads, against `tandem serve` with its default flags.

Usage: unread_rss.py TANDEM_BINARY [--model M.gguf] [--hold SECONDS] [FLAG ...]

Starts `tandem serve` on the real model (extra arguments are passed to it), then opens 60
connections, 10 from each of 6 addresses (127.0.0.10-15), each POSTing /detokenize with 200,000
ids of a 31-byte piece (a 0.8 MB body, a 6.2 MB answer) and never reading. Prints the server's
RSS before, at its peak while the answers wait (`--hold` seconds, polled every 50 ms), and after
the clients hang up, with the peak of /metrics' tandem_write_queued_bytes when the server has it.
Python 3 standard library only; exits 77 when the model is missing.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402  (Http, raw_socket, raw_request, free_port, default_model)

MIB = 1 << 20


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def queued(port):
    status, text = hostile.Http(port, source=hostile.HONEST_ADDR).request("GET", "/metrics")
    for line in text.decode().splitlines() if isinstance(text, bytes) else []:
        if line.startswith("tandem_write_queued_bytes "):
            return float(line.split()[1])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("--model", default=hostile.default_model())
    ap.add_argument("--hold", type=float, default=10.0)
    args, flags = ap.parse_known_args()
    if not os.path.exists(args.model):
        print(f"skipped: the real model is not at {args.model}")
        return 77
    port = hostile.free_port()
    server = hostile.Server(args.binary, args.model, flags, "/dev/null")
    if not server.start([], port=port):
        print("tandem serve did not start")
        return 1
    try:
        client = hostile.Http(port, source=hostile.HONEST_ADDR, timeout=60)
        _, data = client.post("/tokenize", {"content": " " * 31, "with_pieces": True,
                                            "add_special": False})
        piece = max(data["tokens"], key=lambda t: len(t["piece"].encode()))
        body = ('{"tokens":[' + ",".join([str(piece["id"])] * 200_000) + "]}").encode()
        before = rss(server.proc.pid)
        socks = []
        for i in range(60):
            s = hostile.raw_socket(port, source=f"127.0.0.{10 + i % 6}", rcvbuf=4096, timeout=30)
            s.sendall(hostile.raw_request("/detokenize", body, None))
            socks.append(s)
        peak, peak_queued, until, polls = before, None, time.monotonic() + args.hold, 0
        while time.monotonic() < until:
            peak = max(peak, rss(server.proc.pid))
            polls += 1
            if polls % 10 == 0:
                q = queued(port)
                peak_queued = q if peak_queued is None else max(peak_queued, q or 0)
            time.sleep(0.05)
        for s in socks:
            s.close()
        time.sleep(2)
        after = rss(server.proc.pid)
        q = "no tandem_write_queued_bytes" if peak_queued is None else \
            f"queued answers peak {peak_queued / MIB:.0f} MiB"
        print(f"piece {piece['id']} ({len(piece['piece'].encode())} bytes), body {len(body)} bytes;"
              f" RSS before {before / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB while 60 answers "
              f"wait unread, {after / MIB:.0f} MiB after the hang-ups; {q}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
