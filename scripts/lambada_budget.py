#!/usr/bin/env python3
"""Where a route run's cloud budget goes on a word task (LAMBADA), against the oracle's.

Reads a `tandem eval` output folder holding items-local.jsonl, items-cloud.jsonl and route runs
(items-route-*.jsonl), and for each route run sorts the answers it consulted the cloud on
(cloud_tokens > 0: a cloud token inside the answer word) by what the two models alone answer:

  fixable   local wrong, cloud right: the only answers the oracle spends on
  both      both right: the edge had it; the cloud tokens bought nothing
  neither   both wrong: the cloud could not help either
  harmful   local right, cloud wrong: routing can only lose here

and counts the cloud tokens spent past the answer word (the token that ended it, routed).

  scripts/lambada_budget.py eval-out/lambada-heldout [--runs route-lambada-fixes-7%,...] [--json]
"""
import argparse
import json
import os
import sys


def read_items(path):
    items = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            items[r["id"]] = r
    return items


def budget(run, local, cloud):
    kinds = {"fixable": 0, "both": 0, "neither": 0, "harmful": 0}
    tokens = {k: 0 for k in kinds}
    fixed = lost = 0
    past_word = 0
    for item_id, r in run.items():
        if item_id not in local or item_id not in cloud:
            continue
        past_word += r.get("generated_cloud", r["cloud_tokens"]) - r["cloud_tokens"]
        lc, cc = local[item_id]["correct"], cloud[item_id]["correct"]
        fixed += r["correct"] and not lc
        lost += lc and not r["correct"]
        if r["cloud_tokens"] == 0:
            continue
        kind = ("fixable" if cc else "neither") if not lc else ("both" if cc else "harmful")
        kinds[kind] += 1
        tokens[kind] += r["cloud_tokens"]
    fixable_all = sum(1 for i in run
                      if i in local and i in cloud and not local[i]["correct"] and cloud[i]["correct"])
    consulted = sum(kinds.values())
    return {
        "answers_consulted": consulted,
        "by_kind": kinds,
        "cloud_tokens_by_kind": tokens,
        "precision": kinds["fixable"] / consulted if consulted else 0.0,
        "fixable_in_all": fixable_all,
        "recall_of_fixable": kinds["fixable"] / fixable_all if fixable_all else 0.0,
        "answers_fixed": fixed,
        "answers_lost": lost,
        "cloud_tokens_past_the_word": past_word,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--runs", help="comma-separated run names (default: every route run)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    local = read_items(os.path.join(a.folder, "items-local.jsonl"))
    cloud = read_items(os.path.join(a.folder, "items-cloud.jsonl"))
    names = a.runs.split(",") if a.runs else sorted(
        f[len("items-"):-len(".jsonl")] for f in os.listdir(a.folder)
        if f.startswith("items-route-") and f.endswith(".jsonl"))
    out = {}
    for name in names:
        path = os.path.join(a.folder, f"items-{name}.jsonl")
        if not os.path.exists(path):
            sys.exit(f"no {path}")
        out[name] = budget(read_items(path), local, cloud)
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| run | answers consulted | fixable | both right | both wrong | harmful | precision | "
          "recall of fixable | fixed / lost | cloud tokens past the word |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, b in out.items():
        k = b["by_kind"]
        print(f"| {name} | {b['answers_consulted']} | {k['fixable']} | {k['both']} | {k['neither']} | "
              f"{k['harmful']} | {100 * b['precision']:.0f}% | {100 * b['recall_of_fixable']:.1f}% "
              f"of {b['fixable_in_all']} | {b['answers_fixed']} / {b['answers_lost']} | "
              f"{b['cloud_tokens_past_the_word']} |")


if __name__ == "__main__":
    main()
