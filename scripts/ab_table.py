#!/usr/bin/env python3
"""The A/B table of scripts/ab_issue23.sh's output: `tandem bench` prefill and decode tok/s
(median of each run's samples) and bench_serve.py's generated tok/s at 1 and 32 sessions, for
each round of the alternating before/after runs.

  scripts/ab_table.py OUT_DIR
"""
import glob
import json
import os
import statistics
import sys


def serve_rate(path, sessions, key="median"):
    """bench_serve.py's generated tok/s at `sessions` (key per_cpu_s: per server CPU second)."""
    with open(path) as f:
        tp = json.load(f).get("throughput", {})
    return tp.get(str(sessions), {}).get(key)


def main():
    out = sys.argv[1]
    print("| binary, round | pp512 tok/s | tg128 tok/s | serve, 1 session tok/s | serve, 32 sessions tok/s"
          " | 32 sessions, tok per server CPU-s |")
    print("|---|---|---|---|---|---|")
    names = {os.path.basename(p)[:-5].split("-", 1)[1]
             for p in glob.glob(os.path.join(out, "*-*-*.json"))}  # "before-1", "after-3", ...
    for name in sorted(names, key=lambda n: (int(n.split("-")[1]), n)):
        side, rnd = name.split("-")
        bench = os.path.join(out, f"bench-{name}.json")
        pp = tg = "–"
        if os.path.exists(bench):
            with open(bench) as f:
                b = json.load(f)
            pp = f"{statistics.median(b['pp']['samples']):.0f}"
            tg = f"{statistics.median(b['tg']['samples']):.1f}"
        serve = os.path.join(out, f"serve-{name}.json")
        have = os.path.exists(serve)
        s1 = serve_rate(serve, 1) if have else None
        s32 = serve_rate(serve, 32) if have else None
        c32 = serve_rate(serve, 32, "per_cpu_s") if have else None
        fmt = lambda v: "–" if v is None else f"{v:.1f}"
        print(f"| {side}, {rnd} | {pp} | {tg} | {fmt(s1)} | {fmt(s32)} | {fmt(c32)} |")


if __name__ == "__main__":
    main()
