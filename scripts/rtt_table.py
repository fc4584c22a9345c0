#!/usr/bin/env python3
"""The round-trip tables of docs/results.md from scripts/rtt_figures.sh's output: seconds per
answer for each mode at each added round trip, with the cloud share, and for route and
speculative mode the time the device stood still (wait_ms), the routed positions (speculative:
blocks) the cloud confirmed / changed and the small-model tokens thrown away, per answer.

  scripts/rtt_table.py eval-out gsm8k
"""
import json
import os
import sys

RTTS = (0, 20, 100, 200)


def runs(folder):
    path = os.path.join(folder, "results.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["run"]: r for r in json.load(f)["runs"]}


def main():
    out, task = sys.argv[1], sys.argv[2]
    by_rtt = {}
    for rtt in RTTS:
        rows = {}
        for suffix, how in (("", "pipelined"), ("-blocking", "blocking")):
            for k, v in runs(os.path.join(out, f"rtt-{task}-{rtt}{suffix}")).items():
                if k.startswith("route-"):
                    k = f"route 7%, {how}"
                elif k == "speculative":
                    k = f"speculative, {how}"
                rows[k] = v
        by_rtt[rtt] = rows
    modes = ["local", "route 7%, pipelined", "route 7%, blocking", "speculative, pipelined",
             "speculative, blocking", "cloud"]
    head = " | ".join(f"{r} ms" for r in RTTS)
    print(f"| {task}, seconds per answer | {head} | cloud share | vs local at 100 ms |")
    print("|---|" + "---|" * (len(RTTS) + 2))
    for m in modes:
        cells = [f"{by_rtt[r][m]['ms_per_answer'] / 1000:.2f}" if m in by_rtt[r] else "–" for r in RTTS]
        share = next((f"{100 * by_rtt[r][m]['cloud_share']:.1f}%" for r in RTTS if m in by_rtt[r]), "–")
        ref, this = by_rtt[100].get("local"), by_rtt[100].get(m)
        vs = f"{100 * (this['ms_per_answer'] / ref['ms_per_answer'] - 1):+.0f}%" if ref and this else "–"
        print(f"| {m} | " + " | ".join(cells) + f" | {share} | {vs} |")
    print()
    print(f"| {task}, per answer | round trip | wait_ms | confirmed / changed | wasted tokens | round trips |")
    print("|---|---|---|---|---|---|")
    for m in modes[1:5]:
        for r in RTTS:
            x = by_rtt[r].get(m)
            if not x:
                continue
            n = x["items"]
            print(f"| {m} | {r} ms | {x.get('wait_ms_per_answer', 0):.0f} | "
                  f"{x.get('route_confirmed', 0) / n:.1f} / {x.get('route_changed', 0) / n:.1f} | "
                  f"{x.get('wasted_tokens', 0) / n:.1f} | {x['route_events'] / n:.1f} |")

    print()
    print(f"| {task}, route 7% at 100 ms | sync-ahead | seconds per answer | wait_ms per answer |")
    print("|---|---|---|---|")
    for how, suffix in (("blocking", "--no-pipeline"), ("pipelined", "--pipeline")):
        on = by_rtt[100].get(f"route 7%, {how}")
        off = next(iter(runs(os.path.join(out, f"rtt-{task}-100-nosync{suffix}")).values()), None)
        for label, x in (("on", on), ("off", off)):
            if x:
                print(f"| {how} | {label} | {x['ms_per_answer'] / 1000:.2f} | "
                      f"{x.get('wait_ms_per_answer', 0):.0f} |")


if __name__ == "__main__":
    main()
