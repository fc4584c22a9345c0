#!/usr/bin/env bash
# Speed table for docs/benchmarks.md: `tandem bench` (pp512, tg128, 2 threads) on the real default
# model and on random-weight models with the exact shapes of gemma3-270m and qwen2.5-0.5b
# (written by `tandem synth` into the cache on first use). Prints a markdown table on stdout.
# Env: REPS (default 5), THREADS (2), TANDEM (./build/tandem), SHAPES, TYPES.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TANDEM=${TANDEM:-./build/tandem}
REPS=${REPS:-5}
THREADS=${THREADS:-2}
SYNTH_DIR=${TANDEM_CACHE:-$HOME/.cache/tandem}/synth
SHAPES=${SHAPES:-"gemma3-270m qwen2.5-0.5b"}
TYPES=${TYPES:-"Q4_K_M Q8_0"}
mkdir -p "$SYNTH_DIR"

row() {  # row LABEL MODEL
  local json
  json=$("$TANDEM" bench -m "$2" -p 512 -n 128 -t "$THREADS" -r "$REPS" --json 2>/dev/null)
  python3 - "$1" "$2" "$json" <<'PY'
import json, os, statistics, sys
label, path, d = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def cell(t):
    s = t["samples"]
    return f"{statistics.median(s):.1f} (mean {t['tok_s']:.1f} ± {t['sd']:.1f})"
print(f"| {label} | {os.path.getsize(path)/2**20:.0f} | {cell(d['pp'])} | {cell(d['tg'])} | {d['peak_rss_mib']:.0f} |")
PY
}

echo "| model | MiB | pp512 tok/s: median (mean ± sd) | tg128 tok/s: median (mean ± sd) | peak RSS MiB |"
echo "|---|---|---|---|---|"
row "Gemma 3 270M Q4_K_M (real)" "$(bash scripts/fetch_model.sh)"
for shape in $SHAPES; do
  for type in $TYPES; do
    f="$SYNTH_DIR/$shape-$type.gguf"
    [[ -f $f ]] || "$TANDEM" synth --shape "$shape" --type "$type" -o "$f" >/dev/null 2>&1
    row "$shape shape, $type (random weights)" "$f"
  done
done
