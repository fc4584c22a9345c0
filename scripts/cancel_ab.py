#!/usr/bin/env python3
"""A/B of two builds on one `tandem eval` setting, with the server's own count of the work it did:
seconds per answer and wasted tokens (the eval's results.json), and from the server's /metrics
the steps it answered 200 (computed), 409 (refused or cancelled), the tokens it ran through the
model and generated, and the steps cancelled by their device. Meant to show what the device's
cancels of abandoned steps save (docs/results.md, "Cancelling abandoned steps").

  scripts/cancel_ab.py --builds BASE/tandem,NEW/tandem [--reps 3] [--rtt-ms 0] [--ways pipelined,blocking]

Each run starts a fresh `tandem serve -t 1` of the build under test, pinned to core 1, and runs
`tandem eval -t 1` of the same build pinned to core 0: LAMBADA held-out passages 2576-2625,
speculative mode, drafts of 4, on the Gemma pair (scripts/make_pair.sh gemma), as
scripts/rtt_figures.sh does. Builds and ways alternate within each repetition. Each cell: median
(min..max) over the repetitions.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from netutil import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = 'tandem_requests_total{route="/tandem/v1/sessions/{id}/step",status="%d"}'
SERIES = {
    "steps_200": STEP % 200,
    "steps_409": STEP % 409,
    "prompt_tokens": "tandem_prompt_tokens_total",
    "generated_tokens": "tandem_generated_tokens_total",
    "cancelled_steps": "tandem_cancelled_steps_total",
}


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for name, series in SERIES.items():
        m = re.search("^" + re.escape(series) + r" (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def start_server(tandem, model, log):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(["taskset", "-c", "1", tandem, "serve", "-m", model, "--host",
                             "127.0.0.1", "--port", str(port), "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    for _ in range(600):
        try:
            if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            sys.exit(f"the server of {tandem} died: see {log}")
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"the server of {tandem} did not come up: see {log}")


def run_once(tandem, cloud, edge, way, args, out):
    proc, url = start_server(tandem, cloud, out + ".serve.log")
    try:
        before = metrics(url)
        subprocess.run(["taskset", "-c", "0", tandem, "eval", "--task", "lambada", "-m", edge,
                        "--cloud", url, "--items", args.items, "--modes", "speculative",
                        "--draft", "4", f"--{'pipeline' if way == 'pipelined' else 'no-pipeline'}",
                        "--rtt-ms", str(args.rtt_ms), "--no-plots", "-t", "1", "--out", out],
                       check=True, stdout=subprocess.DEVNULL, stderr=open(out + ".log", "w"))
        after = metrics(url)
    finally:
        proc.terminate()
        proc.wait()
    with open(os.path.join(out, "results.json")) as f:
        run = json.load(f)["runs"][0]
    row = {k: after[k] - before[k] for k in SERIES}
    row["s_per_answer"] = run["ms_per_answer"] / 1000
    row["wasted_tokens"] = run["wasted_tokens"]
    row["accuracy"] = run["accuracy"]
    return row


def cell(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--builds", required=True, help="two tandem binaries, comma-separated: base,new")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rtt-ms", type=float, default=0)
    p.add_argument("--items", default="2576-2625")
    p.add_argument("--ways", default="pipelined,blocking")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    args = p.parse_args()
    builds = [os.path.abspath(b) for b in args.builds.split(",")]
    ways = args.ways.split(",")
    cloud, edge = subprocess.run([os.path.join(ROOT, "scripts/make_pair.sh"), "gemma"], check=True,
                                 capture_output=True, text=True).stdout.split()
    out = args.out or tempfile.mkdtemp(prefix="cancel-ab-")
    os.makedirs(out, exist_ok=True)
    rows = {}
    for rep in range(args.reps):
        for way in ways:
            for i, build in enumerate(builds):
                name = f"{['base', 'new'][i]}-{way}"
                row = run_once(build, cloud, edge, way, args, os.path.join(out, f"{name}-{rep}"))
                rows.setdefault(name, []).append(row)
                print(f"[cancel_ab] rep {rep} {name}: {json.dumps(row)}", file=sys.stderr)
    print(f"builds: base = {builds[0]}, new = {builds[1]}; LAMBADA {args.items}, speculative, "
          f"drafts of 4, {args.rtt_ms:g} ms; {args.reps} runs each, median (min..max)\n")
    print("| build, way | s per answer | wasted tokens | server steps 200 | server steps 409 "
          "| tokens run (prompt) | tokens generated | steps cancelled | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        col = lambda k, fmt="{:.0f}": cell([r[k] for r in rs], fmt)
        print(f"| {name} | {col('s_per_answer', '{:.3f}')} | {col('wasted_tokens')} | "
              f"{col('steps_200')} | {col('steps_409')} | {col('prompt_tokens')} | "
              f"{col('generated_tokens')} | {col('cancelled_steps')} | {col('accuracy', '{:.2f}')} |")


if __name__ == "__main__":
    main()
