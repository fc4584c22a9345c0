#!/usr/bin/env python3
"""How the demo's question was chosen (scripts/demo.sh): CommonsenseQA *train* items, asked as a
chat turn with the demo's instruction, first with the 0.5B alone, then routed at a 7% target
through a running `tandem serve` of the 1.5B; prints one line per item and HIT where the 0.5B
alone is wrong and the routed answer right at a realised cloud share <= 7%.

  scripts/demo_search.py URL FIRST COUNT [N_TOKENS]      e.g. URL http://127.0.0.1:8080 4000 100 128

The demo's item, 4034, came from `4000 100` with 64 tokens (those where only the routed answer
was right) and then 128 tokens for the share (<= 7%). The dev split is never searched.
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TANDEM = os.path.join(ROOT, "build", "tandem")
EDGE = os.path.join(os.environ.get("TANDEM_CACHE", os.path.expanduser("~/.cache/tandem")),
                    "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
TRAIN = os.path.join(ROOT, "..", "shared", "data", "commonsenseqa", "train_rand_split.jsonl")
INSTRUCTION = 'Start with "The answer is (X)", then explain why in two sentences.'


def prompt(row):
    q = row["question"]
    return q["stem"] + "\n" + "".join(f"{c['label']}. {c['text']}\n" for c in q["choices"]) + INSTRUCTION


def answer(text):
    m = re.search(r"[Tt]he answer is \(?([A-E])\b", text)
    return m.group(1) if m else None


def ask(text, n, flags):
    out = subprocess.run([TANDEM, "run", "-m", EDGE, "--chat", "-t", "1", "-n", str(n), "--temp",
                          "0", "-p", text, "--json"] + flags, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    url, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    rows = [json.loads(line) for line in open(TRAIN, encoding="utf-8")]
    for i in range(first, first + count):
        row, text = rows[i], prompt(rows[i])
        local = answer(ask(text, n, ["--mode", "local"])["text"])
        line = f"{i} gold={row['answerKey']} local={local}"
        if local != row["answerKey"]:
            r = ask(text, n, ["--mode", "route", "--cloud", url, "--target-rate", "0.07"])
            routed, share = answer(r["text"]), r["stats"]["cloud_share"]
            line += f" route={routed} share={share:.3f} tokens={r['stats']['tokens']}"
            if routed == row["answerKey"] and share <= 0.07:
                line += " HIT"
        print(line, flush=True)


if __name__ == "__main__":
    main()
