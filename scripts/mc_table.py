#!/usr/bin/env python3
"""The multiple-choice tables of docs/results.md from `tandem eval` results.json files: accuracy
with its 95% CI, cloud share, route events, agreement with the cloud-only answer and McNemar
against local, for every run (or the runs named with --runs, in that order). With --against P,
a last column compares each route run's agreement with the cloud-only answer item by item with
route-P at the same target: the items only this run brings to the cloud's answer, against those
only route-P does (exact McNemar p), from the items-RUN.jsonl logs beside results.json.

  scripts/mc_table.py eval-out/mc-csqa/results.json [--runs local,cloud,route-confidence-7%]
"""
import argparse
import json
import math
import os


def pct(x):
    return f"{100 * x:.1f}%"


def mcnemar_p(b, c):
    """Exact two-sided McNemar p for b and c discordant pairs."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def agreements(folder, run):
    """{item id: whether the run's answer is the cloud-only run's}, from the item logs."""
    def answers(name):
        with open(os.path.join(folder, f"items-{name}.jsonl")) as f:
            return {j["id"]: j["answer"] for j in map(json.loads, f)}
    cloud = answers("cloud")
    return {i: a == cloud.get(i) for i, a in answers(run).items()}


def versus(run_folder, run, other_folder, other):
    mine, theirs = agreements(run_folder, run), agreements(other_folder, other)
    only_mine = sum(1 for i in mine if mine[i] and not theirs.get(i, False))
    only_theirs = sum(1 for i in mine if theirs.get(i, False) and not mine[i])
    return f"+{only_mine}/−{only_theirs} ({mcnemar_p(only_mine, only_theirs):.2g})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+",
                    help="results.json files; a run already read from an earlier file is kept")
    ap.add_argument("--runs", help="comma-separated run names, in table order")
    ap.add_argument("--against", help="a policy (e.g. confidence) to compare route runs with")
    args = ap.parse_args()
    runs, folder = {}, {}
    for path in args.results:
        with open(path) as f:
            for r in json.load(f)["runs"]:
                runs.setdefault(r["run"], r)
                folder.setdefault(r["run"], os.path.dirname(path))
    names = args.runs.split(",") if args.runs else list(runs)
    extra = f" agreement, against {args.against}: +only/−only (p) |" if args.against else ""
    print("| run | accuracy (95% CI) | cloud share | route events | agreement with cloud-only answer"
          " | vs local: better / worse (p) |" + extra)
    print("|---|---|---|---|---|---|" + ("---|" if args.against else ""))
    for name in names:
        r = runs[name]
        lo, hi = r.get("ci95", (None, None))
        ci = f" ({100 * lo:.1f}–{100 * hi:.1f})" if lo is not None else ""
        vs = r.get("vs_local")
        against_local = "–" if not vs else f"+{vs['better']}/−{vs['worse']} ({vs['mcnemar_p']:.2g})"
        row = (f"| {name} | {pct(r['accuracy'])}{ci} | {pct(r['cloud_share'])} | {r['route_events']}"
               f" | {pct(r['agreement_with_cloud'])} | {against_local} |")
        if args.against:
            other = f"route-{args.against}-" + name.rsplit("-", 1)[-1]
            paired = name.startswith("route-") and other != name and other in runs
            row += (" " + versus(folder[name], name, folder[other], other) + " |") if paired else " – |"
        print(row)


if __name__ == "__main__":
    main()
