#!/usr/bin/env python3
"""`tandem run` per prompt as a user runs it: one process per prompt, wall time from start to
exit, against a `tandem serve` behind a TCP proxy that adds a round trip (docs/results.md quotes
its output). Meant for a quiet machine.

  scripts/bench_run_rtt.py --edge E --cloud C [--rtts 0,100] [--reps 5] [-n 160]
                           [--builds build,OTHER/build] [--modes local,route,blocking,branches:N]
                           [--chat]
                           [--prompt TEXT | --prompts scripts/rtt_prompts.txt [--items N]]

The cloud (`tandem serve -t 1`) is pinned to core 1, each `tandem run -t 1` to core 0. The proxy
is this script's own (asyncio, not tandem's DelayProxy): every chunk is forwarded half the round
trip after it arrived, in each direction, in order. Route mode runs at a 7% target share with the
confidence policy (`--policy confidence --target-rate 0.07`; a trained router of the pair is
not used, so that every build routes alike); `blocking` is the same with `--no-pipeline`, and
`branches:N` with `--branches N` (docs/client.md, "Branches"; `route` takes the build's default).
Prompts, builds and modes alternate within each repetition. Each cell: the median over prompts of
each prompt's median wall time over --reps runs (min..max over prompts), the answer's own clock
(`stats.total_ms`) and its time to first token (`stats.ttft_ms`) beside it, the cloud's tokens
of all prompts' first runs, each prompt's wall / local of the same build (median, min..max), the
most distinct outputs one prompt gave, on how many prompts the output equals blocking mode's, and
over all runs per routed token: the main line's decodes thrown away (`wasted_tokens`) and the
branch rows a takeover kept / decoded (`branch_kept`, `branch_tokens`; rows ride in the main
line's steps).
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from netutil import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. "
          "Tell it in plain sentences.")


class DelayProxy:
    """127.0.0.1:port -> target, each chunk delayed by rtt/2 in its direction."""

    def __init__(self, target_port, rtt_ms):
        self.target_port = target_port
        self.half = rtt_ms / 2000.0
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_until_complete(server.serve_forever())

    async def _pipe(self, reader, writer):
        queue = asyncio.Queue()

        async def send():
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - self.loop.time()))
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(65536)
                await queue.put((self.loop.time() + self.half, data or None))
                if not data:
                    break
        except (ConnectionError, OSError):
            await queue.put((self.loop.time(), None))
        try:
            await sender
        except (ConnectionError, OSError):
            pass

    async def _client(self, creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(self._pipe(creader, swriter), self._pipe(sreader, cwriter))


def start_serve(tandem, model, port):
    proc = subprocess.Popen(["taskset", "-c", "1", tandem, "serve", "-m", model, "-t", "1",
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("bench_run_rtt.py: tandem serve did not come up")


def run_once(tandem, args, mode, url, prompt):
    cmd = ["taskset", "-c", "0", tandem, "run", "-m", args.edge, "-t", "1", "-n", str(args.n),
           "--temp", "0", "--json", "-p", prompt]
    if args.chat:
        cmd.append("--chat")
    if mode == "local":
        cmd += ["--mode", "local"]
    else:
        cmd += ["--mode", "route", "--cloud", url, "--policy", "confidence",
                "--target-rate", "0.07"]
        if mode == "blocking":
            cmd.append("--no-pipeline")
        if mode.startswith("branches:"):
            cmd += ["--branches", mode.split(":", 1)[1]]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = (time.monotonic() - t0) * 1000
    if out.returncode != 0:
        sys.exit(f"bench_run_rtt.py: {' '.join(cmd)} exited {out.returncode}: {out.stderr[-500:]}")
    j = json.loads(out.stdout)
    return wall, j["stats"], j["ids"]


def cell(xs):
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}..{max(xs):.0f})"


def ratio_cell(xs):
    return f"{statistics.median(xs):.2f}x ({min(xs):.2f}..{max(xs):.2f})"


def read_prompts(args):
    if not args.prompts:
        return [args.prompt]
    with open(args.prompts, encoding="utf-8") as f:
        prompts = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return prompts[:args.items] if args.items else prompts


def measure(args, builds, modes, prompts, url, rtt):
    """{(build, mode, item): [(wall, total, ttft, cloud, tokens, ids)]}, runs interleaved."""
    samples = {}
    for rep in range(args.reps):
        for item, prompt in enumerate(prompts):
            for b in builds:
                for m in modes:
                    wall, st, ids = run_once(os.path.join(b, "tandem"), args, m, url, prompt)
                    wasted = (st.get("wasted_tokens", 0), st.get("branch_kept", 0),
                              st.get("branch_tokens", 0))
                    samples.setdefault((b, m, item), []).append(
                        (wall, st["total_ms"], st.get("ttft_ms", 0), st.get("cloud_tokens", 0),
                         st.get("tokens", 0), tuple(ids), wasted))
                    print(f"rtt {rtt:g} rep {rep} item {item} {b} {m}: wall {wall:.0f} ms, "
                          f"total {st['total_ms']:.0f} ms, cloud {st.get('cloud_tokens', 0)}/"
                          f"{st.get('tokens', 0)}, wasted {st.get('wasted_tokens', 0)}, "
                          f"branches {st.get('branch_kept', 0)}/{st.get('branch_tokens', 0)} "
                          "kept", file=sys.stderr)
    return samples


def rows_for(samples, builds, modes, n_items, rtt):
    """One row per build and mode: each item's median over its runs, then the cell over items."""
    rows = []
    med = lambda xs: statistics.median(xs)
    for b in builds:
        local = [med([r[0] for r in samples[(b, modes[0], i)]]) for i in range(n_items)]
        for m in modes:
            runs = [samples[(b, m, i)] for i in range(n_items)]
            walls = [med([r[0] for r in rs]) for rs in runs]
            clock = [med([r[1] for r in rs]) for rs in runs]
            ttft = [med([r[2] for r in rs]) for rs in runs]
            cloud = sum(rs[0][3] for rs in runs)
            tokens = sum(rs[0][4] for rs in runs)
            distinct = max(len({r[5] for r in rs}) for rs in runs)
            same = "-"
            if m != "blocking" and "blocking" in modes:
                same = sum(samples[(b, m, i)][0][5] == samples[(b, "blocking", i)][0][5]
                           for i in range(n_items))
                same = f"{same}/{n_items}"
            routed = sum(r[3] for rs in runs for r in rs)
            per = [sum(r[6][k] for rs in runs for r in rs) / max(routed, 1) for k in range(3)]
            wasted = f"{per[0]:.2f}" + (f"; {per[1]:.2f}/{per[2]:.2f}" if per[2] else "")
            rows.append((f"{rtt:g}", b, m, cell(walls), cell(clock), cell(ttft),
                         f"{cloud}/{tokens}", ratio_cell([w / l for w, l in zip(walls, local)]),
                         distinct, same, wasted if routed else "-"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edge", required=True)
    ap.add_argument("--cloud", required=True)
    ap.add_argument("--rtts", default="0,100")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("--builds", default=os.path.join(ROOT, "build"))
    ap.add_argument("--modes", default="local,route",
                    help="local, route (pipelined, the default), blocking (route with "
                         "--no-pipeline) and branches:N (route with --branches N); the first is "
                         "the ratio's base")
    ap.add_argument("--prompt", default=PROMPT, help="the prompt (default: a short story)")
    ap.add_argument("--prompts", help="a file of prompts, one per line (# comments)")
    ap.add_argument("--items", type=int, default=0, help="the first N prompts of --prompts")
    ap.add_argument("--chat", action="store_true",
                    help="wrap the prompt in the model's chat template (an instruct pair such as "
                         "Qwen2.5-Coder ends at once on the plain prompt)")
    args = ap.parse_args()
    builds = args.builds.split(",")
    modes = args.modes.split(",")
    prompts = read_prompts(args)
    port = free_port()
    serve = start_serve(os.path.join(builds[0], "tandem"), args.cloud, port)
    rows = []
    try:
        for rtt in [float(r) for r in args.rtts.split(",")]:
            proxy = DelayProxy(port, rtt)
            url = f"http://127.0.0.1:{proxy.port}"
            samples = measure(args, builds, modes, prompts, url, rtt)
            rows += rows_for(samples, builds, modes, len(prompts), rtt)
    finally:
        serve.kill()
        serve.wait()
    print(f"{len(prompts)} prompt(s) x {args.reps} run(s); each cell: the median over prompts of "
          "each prompt's median (min..max over prompts)")
    print("| rtt ms | build | mode | wall ms | answer's clock ms | first token ms | cloud tokens "
          "| wall / local | distinct outputs | same as blocking | per routed token: wasted; branch rows kept/decoded |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
