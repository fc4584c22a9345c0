#!/usr/bin/env python3
"""`tandem bench` against llama.cpp's `llama-bench` on the same GGUF files, alternating, and the
decode roof of this machine (docs/benchmarks.md quotes its output).

  scripts/bench_vs_llama_bench.py --llama-bench PATH [--rounds 2] [--reps 3] [-t 2] [MODEL ...]
  (default models: the default pair, Qwen2.5-Coder 0.5B and 1.5B Instruct Q4_K_M)

Each round runs, per model, `llama-bench -m M -t T -p 512 -n 128 -r R -o json` (llama.cpp's
defaults) and `tandem bench -m M -t T -p 512 -n 128 -r R --json`; the table gives the median of
all samples with min..max, and the ratio of the medians. The roof: the weight bytes one decoded
token reads (every tensor but the token embedding, of which one row; read from the GGUF's tensor
table) times tokens/s, against a streaming read of this machine (bench_kernels' BM_ReadSum, one
copy per thread at once, summed).
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.environ.get("TANDEM_CACHE", os.path.expanduser("~/.cache/tandem")), "models")
DEFAULT_MODELS = [os.path.join(CACHE, f"qwen2.5-coder-{s}-instruct-q4_k_m.gguf") for s in ("0.5b", "1.5b")]
# ggml type -> (bytes per block, elements per block), for the types these files hold.
BLOCK = {0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32),
         10: (84, 256), 11: (110, 256), 12: (144, 256), 13: (176, 256), 14: (210, 256), 30: (2, 1)}
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def bytes_per_token(path):
    """Weight bytes a decoded token reads: all tensors, the token embedding as one row."""
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))

        def rstr():
            return f.read(rd("Q")[0])

        def skip_value(t):
            if t == 8:
                rstr()
            elif t == 9:
                at, n = rd("IQ")
                for _ in range(n):
                    skip_value(at)
            else:
                rd(SCALAR[t])

        f.read(4)
        _, n_tensors, n_kv = rd("IQQ")
        for _ in range(n_kv):
            rstr()
            skip_value(rd("I")[0])
        total = 0
        for _ in range(n_tensors):
            name = rstr().decode()
            dims = rd("Q" * rd("I")[0])
            ttype = rd("I")[0]
            rd("Q")
            n = 1
            for d in dims:
                n *= d
            size = n // BLOCK[ttype][1] * BLOCK[ttype][0]
            total += size // dims[1] if name == "token_embd.weight" else size
        return total


def llama_bench(args, model):
    out = subprocess.run([args.llama_bench, "-m", model, "-t", str(args.threads), "-p", "512",
                          "-n", "128", "-r", str(args.reps), "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    get = lambda pp: next(r["samples_ts"] for r in rows if (r["n_prompt"] > 0) == pp)
    return get(True), get(False)


def tandem_bench(args, model):
    out = subprocess.run([args.tandem, "bench", "-m", model, "-t", str(args.threads), "-p", "512",
                          "-n", "128", "-r", str(args.reps), "--json"],
                         capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    return j["pp"]["samples"], j["tg"]["samples"]


def read_roof(args):
    """GB/s of a streaming read, one BM_ReadSum copy per thread at once."""
    exe = os.path.join(os.path.dirname(args.tandem), "bench", "bench_kernels")
    procs = [subprocess.Popen(["taskset", "-c", str(c), exe, "--benchmark_filter=BM_ReadSum$",
                               "--benchmark_repetitions=5", "--benchmark_format=json"],
                              stdout=subprocess.PIPE, text=True) for c in range(args.threads)]
    total = 0.0
    for p in procs:
        runs = json.loads(p.communicate()[0])["benchmarks"]
        total += statistics.median(r["bytes_per_second"] for r in runs if r["run_type"] == "iteration")
    return total / 1e9


def span(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}..{max(v):.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    args = ap.parse_args()
    got = {m: {"llama": ([], []), "tandem": ([], [])} for m in args.models}
    for r in range(args.rounds):
        for m in args.models:
            for kind, fn in (("llama", llama_bench), ("tandem", tandem_bench)):
                pp, tg = fn(args, m)
                got[m][kind][0].extend(pp)
                got[m][kind][1].extend(tg)
                print(f"round {r + 1} {os.path.basename(m)} {kind}: pp {statistics.median(pp):.1f}"
                      f" tg {statistics.median(tg):.1f}", file=sys.stderr)
    roof = read_roof(args)
    print(f"streaming read, {args.threads} threads: {roof:.1f} GB/s\n")
    print("| model | test | llama-bench tok/s | tandem bench tok/s | ratio |")
    print("|---|---|---|---|---|")
    for m in args.models:
        for i, test in enumerate(("pp512", "tg128")):
            lb, tb = got[m]["llama"][i], got[m]["tandem"][i]
            print(f"| {os.path.basename(m)} | {test} | {span(lb)} | {span(tb)} | "
                  f"{statistics.median(tb) / statistics.median(lb):.2f}x |")
    print("\n| model | weight bytes per token | roof tok/s | tandem tg128 | share of the roof |")
    print("|---|---|---|---|---|")
    for m in args.models:
        b = bytes_per_token(m)
        tg = statistics.median(got[m]["tandem"][1])
        print(f"| {os.path.basename(m)} | {b / 1e6:.1f} MB | {roof * 1e9 / b:.1f} | {tg:.1f} | "
              f"{tg * b / (roof * 1e9):.0%} |")


if __name__ == "__main__":
    main()
