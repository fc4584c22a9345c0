#!/usr/bin/env python3
"""Benchmarks of `tandem run` against `tandem serve` on 127.0.0.1 (docs/benchmarks.md quotes its
output). The cloud is pinned to --server-cores, the device to --client-cores (taskset).

  scripts/bench_run.py [--edge E] [--cloud C] [--server-cores 1] [--client-cores 0] [--reps 3]
                       [--sections 1,2,3,4] [--rates 0.05,0.2]

1. Route events: `--policy always` (every token a route event): cloud time per event, against one
   bare cloud decode step (`tandem bench -p 0 -n 128` of the cloud model on the server's cores).
2. Bytes up and down per route event at contexts 64..2048, native protocol and each stateless
   backend (openai, sglang, llamacpp: tandem serve's own compatible endpoints).
3. Cloud tokens prefilled per route event at a 10% target share, sync-ahead on and off.
4. Speculative mode: tok/s and acceptance against cloud-only decoding; route mode's tok/s at the
   --rates target shares (default 5% and 20%) against local decoding.
--sections picks which of these run (the bare cloud decode step comes with section 1). The
default pair of the figures is the Gemma pair; --edge/--cloud take any other, e.g. the Qwen pair
(scripts/make_pair.sh qwen).
Each figure is the median of --reps runs (min..max in brackets).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

from netutil import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = ("Q: What is the capital of France?\nA: Paris.\nQ: What is the largest planet in the "
          "solar system?\nA:")


def start_server(args):
    port = free_port()
    proc = subprocess.Popen(["taskset", "-c", args.server_cores, args.tandem, "serve", "-m",
                             args.cloud, "--port", str(port), "-t", str(args.threads), "-c",
                             "4096"], stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("server did not start")


def run(args, url, *flags, prompt=PROMPT, n=64):
    cmd = ["taskset", "-c", args.client_cores, args.tandem, "run", "-m", args.edge, "--cloud", url,
           "-t", str(args.threads), "-n", str(n), "--temp", "0", "--json", "-c", "4096",
           "-p", prompt, *flags]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[:12])}...: {out.stderr[-500:]}")
    return json.loads(out.stdout)


def med(values):
    values = sorted(values)
    return {"median": statistics.median(values), "min": values[0], "max": values[-1]}


def show(label, m, unit=""):
    print(f"{label}: {m['median']:.2f}{unit} ({m['min']:.2f}..{m['max']:.2f})", file=sys.stderr)


def long_prompt(n_tokens):
    # About one token per word for this text; trimmed by the model's own count below.
    words = open(os.path.join(ROOT, "..", "shared", "data", "wikitext-2", "test.txt")).read().split()
    return " ".join(words[:n_tokens])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    pair = subprocess.run(["bash", os.path.join(ROOT, "scripts", "make_pair.sh"), "gemma"],
                          capture_output=True, text=True).stdout.split()
    ap.add_argument("--cloud", default=pair[0] if pair else None)
    ap.add_argument("--edge", default=pair[1] if len(pair) > 1 else None)
    ap.add_argument("--server-cores", default="1")
    ap.add_argument("--client-cores", default="0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sections", default="1,2,3,4")
    ap.add_argument("--rates", default="0.05,0.2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sections = {int(s) for s in args.sections.split(",")}
    res = {}
    proc, url = start_server(args)
    try:
        if 1 in sections:
            route_events(args, url, res)
        if 2 in sections:
            bytes_per_event(args, url, res)
        if 3 in sections:
            prefill_per_event(args, url, res)
        if 4 in sections:
            speed_per_mode(args, url, res)
    finally:
        proc.terminate()
        proc.wait()
    if 1 in sections:
        bare_decode(args, res)
    if args.json:
        print(json.dumps(res, indent=1))


def route_events(args, url, res):
    per_event = []
    for _ in range(args.reps):
        s = run(args, url, "--mode", "route", "--policy", "always")["stats"]
        per_event.append(s["cloud_ms"] / max(1, s["route_events"]))
    res["route_event_ms"] = med(per_event)
    show("route event (policy always), cloud ms per event", res["route_event_ms"], " ms")


def bytes_per_event(args, url, res):
    res["bytes"] = []
    for ctx in (64, 256, 1024, 2048):
        row = {"context_words": ctx}
        for api in ("tandem", "openai", "sglang", "llamacpp"):
            s = run(args, url, "--mode", "route", "--policy", "always", "--cloud-api", api,
                    prompt=long_prompt(ctx), n=16)["stats"]
            ev = max(1, s["route_events"])
            row[api] = {"up": s["bytes_up"] / ev, "down": s["bytes_down"] / ev}
        res["bytes"].append(row)
        print(f"context ~{ctx} words: " + ", ".join(
            f"{api} {row[api]['up']:.0f}/{row[api]['down']:.0f} B" for api in
            ("tandem", "openai", "sglang", "llamacpp")) + " (up/down per route event)",
            file=sys.stderr)


def prefill_per_event(args, url, res):
    for label, flags in (("sync_ahead", []), ("no_sync_ahead", ["--no-sync-ahead"])):
        vals = []
        for _ in range(args.reps):
            s = run(args, url, "--mode", "route", "--target-rate", "0.1", *flags, n=128)["stats"]
            vals.append(s["prefilled_on_route"] / max(1, s["route_events"]))
        res["prefilled_per_event_" + label] = med(vals)
        show(f"cloud tokens prefilled per route event ({label})", res["prefilled_per_event_" + label])


def speed_per_mode(args, url, res):
    routes = [(f"route_{float(r) * 100:g}", ["--mode", "route", "--target-rate", r])
              for r in args.rates.split(",")]
    for label, flags in [("local", ["--mode", "local"]), ("cloud", ["--mode", "cloud"]),
                         ("speculative", ["--mode", "speculative"])] + routes:
        tok_s, acc = [], []
        for _ in range(args.reps):
            s = run(args, url, *flags, n=128)["stats"]
            tok_s.append(s["tok_s"])
            if s.get("drafted"):
                acc.append(s["accepted_drafts"] / s["drafted"])
        res["tok_s_" + label] = med(tok_s)
        show(f"tok/s {label}", res["tok_s_" + label])
        if acc:
            res["acceptance_" + label] = med(acc)
            show(f"draft acceptance {label}", res["acceptance_" + label])


def bare_decode(args, res):
    out = subprocess.run(["taskset", "-c", args.server_cores, args.tandem, "bench", "-m", args.cloud,
                          "-p", "0", "-n", "128", "-t", str(args.threads), "-r", "5", "--json"],
                         capture_output=True, text=True, check=True)
    res["bare_cloud_decode_ms"] = 1000.0 / json.loads(out.stdout)["tg"]["tok_s"]
    print(f"bare cloud decode step: {res['bare_cloud_decode_ms']:.2f} ms; route event / decode step "
          f"= {res['route_event_ms']['median'] / res['bare_cloud_decode_ms']:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
